-- pglease: fencing, the database as the enforcement point.
--
-- A transaction that writes under a lease declares it with
-- assert_held(name, token): the check is made on the database clock, and
-- the lock it takes keeps any other acquisition from committing until the
-- transaction ends, so a write checked under a valid token cannot be
-- overtaken by a new holder. protect(tbl, name) makes a table demand that
-- declaration from every writer. advance(resource, token) is the fence for
-- a resource that keeps its own high-water mark instead.
--
-- The CLOCK, LOCKS, DURABILITY and PRIVILEGES rules of 0001_schema.sql
-- apply to every function here.

------------------------------------------------------------------------
-- assert_held(name, token): the guarded-write check.
------------------------------------------------------------------------

-- Besides the row lock, a transaction that passes the check takes the
-- marker by which an acquisition after the lease has ended finds it (and
-- ends it, see acquire): the shared advisory lock (1886152293, id) until
-- the transaction ends. The guard trigger of protected tables calls this
-- again at each write; taking a lock this transaction already holds costs
-- a look-up in the session's own lock table.
CREATE FUNCTION pglease.assert_held(name text, token bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked      text;
    cur_token    bigint;
    cur_holder   text;
    cur_expiry   timestamptz;
    cur_released timestamptz;
    cur_id       integer;
    t            timestamptz;
    declared     text;
BEGIN
    IF NOT coalesce(octet_length(assert_held.name) BETWEEN 1 AND pglease._max_text_bytes()
                    AND assert_held.token IS NOT NULL, false) THEN
        checked := pglease._check_text('name', assert_held.name);
        PERFORM pglease._check_token(assert_held.token);
    END IF;

    -- FOR KEY SHARE lasts until the caller's transaction ends and blocks
    -- the key update every acquisition makes (see LOCKS in 0001_schema.sql).
    SELECT l.token, l.holder, l.expires_at, l.released_at, l.id
      INTO cur_token, cur_holder, cur_expiry, cur_released, cur_id
      FROM pglease.leases AS l WHERE l.name = assert_held.name FOR KEY SHARE;
    -- The clock is read after the lock is held.
    t := clock_timestamp();
    IF NOT (FOUND AND cur_token = assert_held.token AND cur_token <> 0
            AND cur_holder IS NOT NULL AND t < cur_expiry) THEN
        -- DETAIL says the same as data, for clients: space-separated
        -- key=value fields, name last (it may contain spaces); times in
        -- RFC 3339, UTC.
        IF NOT FOUND OR cur_token = 0 THEN
            RAISE EXCEPTION USING ERRCODE = 'LE001',
                MESSAGE = format('pglease: lease %L is not held: it has never been acquired',
                                 assert_held.name),
                DETAIL = format('reason=never_acquired token=%s name=%s',
                                assert_held.token, assert_held.name);
        END IF;
        IF cur_token <> assert_held.token THEN
            RAISE EXCEPTION USING ERRCODE = 'LE001',
                MESSAGE = format('pglease: lease %L is not held under token %s: %s',
                                 assert_held.name, assert_held.token,
                                 CASE WHEN assert_held.token < cur_token
                                      THEN format('the token is stale, the lease was acquired again with token %s', cur_token)
                                      ELSE 'no such token has been issued for this lease' END),
                DETAIL = format('reason=%s token=%s current_token=%s name=%s',
                                CASE WHEN assert_held.token < cur_token THEN 'stale' ELSE 'not_issued' END,
                                assert_held.token, cur_token, assert_held.name);
        END IF;
        IF cur_holder IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'LE001',
                MESSAGE = format('pglease: lease %L is not held under token %s: it was released at %s',
                                 assert_held.name, assert_held.token, cur_released),
                DETAIL = format('reason=released token=%s at=%s name=%s', assert_held.token,
                                to_char(cur_released AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                                assert_held.name);
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'LE001',
            MESSAGE = format('pglease: lease %L is not held under token %s: it expired at %s (database time now %s)',
                             assert_held.name, assert_held.token, cur_expiry, t),
            DETAIL = format('reason=expired token=%s at=%s name=%s', assert_held.token,
                            to_char(cur_expiry AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                            assert_held.name);
    END IF;

    -- The marker, taken only once the token is found valid (a session is
    -- never ended for a check that fails). A try, so that nobody can make
    -- checks wait by holding the key exclusively: then this transaction
    -- is not marked, and an acquisition after the lease has ended cannot
    -- end it (it reports the lease pinned instead).
    IF NOT pg_try_advisory_xact_lock_shared(1886152293, cur_id) THEN
        RAISE WARNING USING MESSAGE = format(
            'pglease: lease %L: advisory lock (1886152293, %s) is held exclusively by another '
            'session, so this transaction is not marked as fenced, and an acquisition after '
            'the lease ends cannot end it; that key space (0x706c6665) is pglease''s',
            assert_held.name, cur_id);
    END IF;

    -- Record the declaration for the rest of the transaction (protected
    -- tables read it): a JSON object mapping lease name to token.
    declared := current_setting('pglease.declared', true);
    IF declared IS NULL OR declared = '' THEN
        declared := jsonb_build_object(assert_held.name, assert_held.token)::text;
    ELSE
        declared := (declared::jsonb || jsonb_build_object(assert_held.name, assert_held.token))::text;
    END IF;
    checked := set_config('pglease.declared', declared, true);
END
$$;

COMMENT ON FUNCTION pglease.assert_held(text, bigint) IS
    'Inside a transaction: fail with SQLSTATE LE001 unless lease NAME is valid '
    'under TOKEN, and keep any other acquisition of NAME from committing until '
    'this transaction ends. Records the declaration for protected tables.';

------------------------------------------------------------------------
-- protect(tbl, name) / unprotect(tbl): tables that only a holder may write.
------------------------------------------------------------------------

-- protect(tbl, name) makes a table reject every INSERT (including COPY),
-- UPDATE, DELETE and TRUNCATE from a transaction that does not hold lease
-- NAME with a current, unexpired token; unprotect(tbl) undoes it. Code that
-- ignores the lease altogether is rejected, not only stale tokens.
--
-- A transaction declares its token with pglease.assert_held(name, token),
-- which records it in the transaction-local setting pglease.declared. A
-- write to a protected table without a declaration fails with SQLSTATE
-- LE002. With one, the trigger calls assert_held again: the token must
-- still be current and the database clock (clock_timestamp(), at the write)
-- before expires_at, or the write fails with LE001; and the FOR KEY SHARE
-- lock it takes keeps any other acquisition from committing until this
-- transaction ends. The setting itself proves nothing (anyone can SET it):
-- it only says which token to check, and the check is made on every write.
--
-- The triggers are statement-level BEFORE triggers: one check per write
-- statement, whatever the number of rows (the benchmark reports the cost
-- per row beside a row-level trigger). TRUNCATE only has statement-level
-- triggers anyway. A statement checked before expiry may write its rows
-- after it, as any write checked before expiry may commit after it; no
-- other acquisition can commit meanwhile. INSERT ... ON CONFLICT, MERGE,
-- writable CTEs and foreign-key cascades fire these triggers too.
-- Statement-level triggers are not inherited, so partitioned tables,
-- partitions and inheritance children are refused.
--
-- protect and unprotect require ownership of the table (or the privileges
-- of its owning role), not only the TRIGGER privilege: a role granted
-- TRIGGER (GRANT ALL includes it) could otherwise point a table's fence at
-- a lease it controls.

CREATE FUNCTION pglease._guard()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lease    text := TG_ARGV[0];
    declared text;
BEGIN
    declared := nullif(current_setting('pglease.declared', true), '')::jsonb ->> lease;
    IF declared IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'LE002',
            MESSAGE = format('pglease: %s on %s rejected: the table is protected by lease %L '
                             'and this transaction declared no token for it',
                             TG_OP, TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME, lease),
            HINT = format('Call pglease.assert_held(%L, <token>) in the same transaction first.', lease);
    END IF;
    -- Re-check at the moment of this write (LE001 if stale or expired) and
    -- (re)take the lock that holds off other acquisitions until commit.
    PERFORM pglease.assert_held(lease, declared::bigint);
    IF TG_LEVEL = 'ROW' THEN
        RETURN coalesce(NEW, OLD);
    END IF;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION pglease._guard() IS
    'Trigger of protected tables (see pglease.protect): LE002 without a declared '
    'token for the lease, LE001 unless the declared token is still valid.';

-- What protect and unprotect check first: a table is named, and the
-- caller may alter it. Runs with the caller's rights: the caller must own
-- the table (or have the privileges of its owning role), as ALTER TABLE
-- requires; the TRIGGER privilege alone is not enough.
CREATE FUNCTION pglease._check_may_alter(tbl regclass, action text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    owner oid;
BEGIN
    IF tbl IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'tbl',
            MESSAGE = 'pglease: tbl must not be NULL';
    END IF;
    SELECT c.relowner INTO owner FROM pg_class AS c WHERE c.oid = tbl;
    IF owner IS NOT NULL AND NOT pg_has_role(current_user, owner, 'USAGE') THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('pglease: must be the owner of table %s to %s it', tbl, action);
    END IF;
END
$$;

CREATE FUNCTION pglease.protect(tbl regclass, name text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked text;
BEGIN
    PERFORM pglease._check_may_alter(tbl, 'protect');
    checked := pglease._check_text('name', protect.name);
    IF (SELECT c.relkind FROM pg_class AS c WHERE c.oid = tbl) IS DISTINCT FROM 'r' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'tbl',
            MESSAGE = format('pglease: tbl %s is not an ordinary table', tbl);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_inherits AS i WHERE i.inhrelid = tbl OR i.inhparent = tbl) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'tbl',
            MESSAGE = format('pglease: tbl %s is part of a partition or inheritance tree, '
                             'which protect does not cover', tbl);
    END IF;
    EXECUTE format('CREATE OR REPLACE TRIGGER pglease_protect BEFORE INSERT OR UPDATE OR DELETE ON %s '
                   'FOR EACH STATEMENT EXECUTE FUNCTION pglease._guard(%L)', tbl, protect.name);
    EXECUTE format('CREATE OR REPLACE TRIGGER pglease_protect_truncate BEFORE TRUNCATE ON %s '
                   'FOR EACH STATEMENT EXECUTE FUNCTION pglease._guard(%L)', tbl, protect.name);
END
$$;

COMMENT ON FUNCTION pglease.protect(regclass, text) IS
    'Make table TBL reject INSERT, UPDATE, DELETE and TRUNCATE from transactions '
    'that do not hold lease NAME (declared with pglease.assert_held).';

CREATE FUNCTION pglease.unprotect(tbl regclass)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    was boolean;
BEGIN
    PERFORM pglease._check_may_alter(tbl, 'unprotect');
    was := EXISTS (SELECT 1 FROM pg_trigger AS t
                    WHERE t.tgrelid = tbl AND t.tgname = 'pglease_protect');
    EXECUTE format('DROP TRIGGER IF EXISTS pglease_protect ON %s', tbl);
    EXECUTE format('DROP TRIGGER IF EXISTS pglease_protect_truncate ON %s', tbl);
    RETURN was;
END
$$;

COMMENT ON FUNCTION pglease.unprotect(regclass) IS
    'Remove the protection pglease.protect put on table TBL. Returns whether '
    'it was protected.';

------------------------------------------------------------------------
-- advance(resource, token): separate-resource fencing.
------------------------------------------------------------------------

CREATE FUNCTION pglease.advance(resource text, token bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked       text;
    checked_token bigint;
    highest       bigint;
    accepted      boolean;
BEGIN
    checked := pglease._check_text('resource', advance.resource);
    checked_token := pglease._check_token(advance.token);
    IF advance.token <= 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'token',
            MESSAGE = format('pglease: token must be positive, got %s', advance.token);
    END IF;

    -- Read-only answers when nothing would change.
    SELECT f.token INTO highest FROM pglease.fences AS f WHERE f.resource = advance.resource;
    IF FOUND AND highest > advance.token THEN
        RETURN false;
    END IF;
    IF FOUND AND highest = advance.token THEN
        RETURN true;
    END IF;

    -- A high-water mark that went backwards after a crash would accept an
    -- old token again: this commit must be durable.
    IF current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    INSERT INTO pglease.fences AS f (resource, token, advanced_at)
    VALUES (advance.resource, advance.token, clock_timestamp())
    ON CONFLICT ON CONSTRAINT fences_pkey DO UPDATE
        SET token = excluded.token, advanced_at = excluded.advanced_at
        WHERE f.token <= excluded.token
    RETURNING true INTO accepted;
    RETURN coalesce(accepted, false);
END
$$;

COMMENT ON FUNCTION pglease.advance(text, bigint) IS
    'Separate-resource fencing: accept TOKEN for RESOURCE iff it is >= the highest '
    'token accepted so far, and record it. Returns true if accepted.';
