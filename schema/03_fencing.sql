-- =====================================================================
-- 3. FENCING: THE DATABASE AS THE ENFORCEMENT POINT
--
-- A transaction that writes under a lease declares it with
-- assert_held(name, token): the check is made on the database clock, and
-- the lock it takes keeps any other acquisition from committing until the
-- transaction ends, so a write checked under a valid token cannot be
-- overtaken by a new holder. protect(tbl, name) makes a table demand that
-- declaration from every writer. admit(resource, token) is the fence for
-- a resource that keeps its own high-water mark instead.
-- =====================================================================

-- LATER PARTS. Used here, defined in a later part (PL/pgSQL looks a
-- name up when a function runs, not when it is created): 4: _forgotten,
-- _refuse_standby, _timeline_checked; 7: _record; 12: _shared.

------------------------------------------------------------------------
-- assert_held(name, token): the guarded-write check.
------------------------------------------------------------------------

-- Besides the row lock, a transaction that passes the check takes the
-- marker by which an acquisition after the lease has ended finds it (and
-- ends it, see acquire): a shared advisory lock on a key derived from the
-- lease's secret and the transaction's id, until the transaction ends. The guard trigger of protected tables calls this
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
    cur_role     name;
    cur_secret   bytea;
    cur_pid      integer;
    cur_start    timestamptz;
    marker       bigint;
    t            timestamptz;
    declared     text;
    found_row    boolean;
    lost_in      pglease._timelines;
    my_xid       xid;
BEGIN
    IF NOT coalesce(octet_length(assert_held.name) BETWEEN 1 AND pglease._max_text_bytes()
                    AND assert_held.token IS NOT NULL, false) THEN
        checked := pglease._check_text('name', assert_held.name);
        PERFORM pglease._check_token(assert_held.token);
    END IF;

    -- FOR KEY SHARE lasts until the caller's transaction ends and blocks
    -- the FOR UPDATE lock every acquisition takes (see LOCKS at the top).
    SELECT l.token, l.holder, l.expires_at, l.released_at, l.role, l.secret, l.session_pid,
           l.session_start
      INTO cur_token, cur_holder, cur_expiry, cur_released, cur_role, cur_secret, cur_pid,
           cur_start
      FROM pglease.leases AS l WHERE l.name = assert_held.name FOR KEY SHARE;
    found_row := FOUND;
    -- The clock is read after the lock is held.
    t := clock_timestamp();
    IF NOT (found_row AND cur_token = assert_held.token AND cur_token <> 0
            AND cur_holder IS NOT NULL AND t < cur_expiry
            AND (cur_pid IS NULL OR NOT pglease._session_gone(cur_pid, cur_start))) THEN
        -- DETAIL says the same as data, for clients: space-separated
        -- key=value fields, name last (it may contain spaces); times in
        -- RFC 3339, UTC.
        IF NOT found_row OR cur_token <> assert_held.token THEN
            -- An acquisition this server forgot in a change of timeline
            -- has a reason of its own (see TIMELINES).
            lost_in := pglease._forgotten(assert_held.token, CASE WHEN found_row THEN cur_token END);
            IF lost_in.timeline IS NOT NULL THEN
                RAISE EXCEPTION USING ERRCODE = 'LE001',
                    MESSAGE = format('pglease: lease %L is not held under token %s: the database '
                                     'changed to timeline %s (a failover or a restore) and lost '
                                     'that acquisition with the old timeline''s latest commits',
                                     assert_held.name, assert_held.token, lost_in.timeline),
                    DETAIL = format('reason=forgotten token=%s timeline=%s name=%s',
                                    assert_held.token, lost_in.timeline, assert_held.name);
            END IF;
        END IF;
        IF found_row AND cur_token <> assert_held.token
           AND EXISTS (SELECT 1 FROM pglease._shared AS s
                        WHERE s.token = assert_held.token AND s.name = assert_held.name) THEN
            -- See SHARED LEASES.
            RAISE EXCEPTION USING ERRCODE = 'LE001',
                MESSAGE = format('pglease: lease %L is not held exclusively under token %s: it '
                                 'is a shared holder''s token, which pglease.assert_shared '
                                 'checks; writes under the lease need the exclusive holder''s',
                                 assert_held.name, assert_held.token),
                DETAIL = format('reason=shared token=%s name=%s', assert_held.token,
                                assert_held.name);
        END IF;
        IF NOT found_row OR cur_token = 0 THEN
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
        IF t < cur_expiry THEN
            RAISE EXCEPTION USING ERRCODE = 'LE001',
                MESSAGE = format('pglease: lease %L is not held under token %s: the server session '
                                 'it was bound to (process %s) has ended',
                                 assert_held.name, assert_held.token, cur_pid),
                DETAIL = format('reason=session_ended token=%s pid=%s name=%s', assert_held.token,
                                cur_pid, assert_held.name);
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'LE001',
            MESSAGE = format('pglease: lease %L is not held under token %s: it expired at %s (database time now %s)',
                             assert_held.name, assert_held.token, cur_expiry, t),
            DETAIL = format('reason=expired token=%s at=%s name=%s', assert_held.token,
                            to_char(cur_expiry AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                            assert_held.name);
    END IF;

    -- Only the role that acquired the lease, its members and
    -- administrators act under its token (see AUTHORITY at the top).
    -- (Nested, so that the second test is prepared only when it is needed.)
    IF cur_role IS DISTINCT FROM session_user THEN
        IF NOT pglease._may_act(cur_role) THEN
            PERFORM pglease._refuse_owner(assert_held.name, cur_role, 'write under');
        END IF;
    END IF;

    -- The marker (see TAKEOVER at acquire), taken only once the token is
    -- found valid (a session is never ended for a check that fails).
    -- Nobody without the lease's secret can hold it first; should the try
    -- fail all the same, the check fails rather than leave this
    -- transaction unmarked (a frozen unmarked holder would pin the lease).
    -- The transaction id first, in a variable: with a volatile argument
    -- the SQL function _marker would not be inlined (about 8 us a call).
    my_xid := pg_current_xact_id()::xid;
    marker := pglease._marker(cur_secret, my_xid);
    IF NOT pg_try_advisory_xact_lock_shared(marker) THEN
        RAISE EXCEPTION USING ERRCODE = '55P03',
            MESSAGE = format('pglease: lease %L: this transaction''s fenced marker is held '
                             'exclusively by another session (%s)', assert_held.name,
                             pglease._key_holders(marker >> 32, marker, 1));
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


-- Which sessions are fenced on which lease right now (the marker taken by
-- assert_held). It computes a marker per lease and transaction holding a
-- 64-bit advisory lock: about a microsecond each, so a second or so for
-- a million leases and one such transaction. A view for people; the
-- functions look a lease's sessions up by its secret.
CREATE VIEW pglease.fenced AS
SELECT l.name, f.pid
  FROM pglease.leases AS l
 CROSS JOIN LATERAL pglease._fenced_pids(l.secret) AS f(pid)
 WHERE l.token > 0
   AND EXISTS (SELECT 1 FROM pg_locks AS a WHERE a.locktype = 'advisory' AND a.objsubid = 1);

COMMENT ON VIEW pglease.fenced IS
    'Sessions (pid) with an open transaction fenced on each lease (pglease.assert_held). '
    'An acquisition after the lease has ended ends these sessions.';

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
-- of its owning role), not only the TRIGGER privilege. The lease a table
-- is protected by is bound in pglease._protected, which only protect and
-- unprotect write; the guard reads it there and ignores its trigger's
-- arguments, so a role granted TRIGGER (GRANT ALL includes it) cannot
-- point a table's fence at a lease it controls by replacing the trigger.
-- It can still replace or add triggers that PostgreSQL lets it: the view
-- pglease.protected says whether both guard triggers are intact, and
-- `pglease doctor` names the roles that hold TRIGGER on protected tables
-- (grant them SELECT, INSERT, UPDATE, DELETE only).

CREATE FUNCTION pglease._guard()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lease    text;
    declared text;
BEGIN
    SELECT p.name INTO lease FROM pglease._protected AS p WHERE p.tbl = TG_RELID;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = format('pglease: %s on %s rejected: the table has pglease''s guard '
                             'trigger but was not protected with pglease.protect',
                             TG_OP, TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME);
    END IF;
    declared := nullif(current_setting('pglease.declared', true), '')::jsonb ->> lease;
    IF declared IS NULL THEN
        -- A session that declared the lease for its whole life (see
        -- DECLARED SESSIONS below): its claim is checked as assert_held
        -- checks it, which also records it for the rest of the
        -- transaction. Read only here, so that a transaction that
        -- declared its token pays nothing for it.
        IF NOT pglease._check_session(lease) THEN
            RAISE EXCEPTION USING ERRCODE = 'LE002',
                MESSAGE = format('pglease: %s on %s rejected: the table is protected by lease %L '
                                 'and this transaction declared no token for it',
                                 TG_OP, TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME, lease),
                HINT = format('Call pglease.assert_held(%L, <token>) in the same transaction '
                              'first, or declare the lease for the session (pglease run '
                              '--declare).', lease);
        END IF;
    ELSE
        -- Re-check at the moment of this write (LE001 if stale or expired)
        -- and (re)take the lock that holds off other acquisitions until
        -- commit.
        PERFORM pglease.assert_held(lease, declared::bigint);
    END IF;
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

-- Binds table TBL to lease NAME (NULL: unbinds it; returns whether it
-- was bound). SECURITY DEFINER to write the binding, so it checks again,
-- by the session's login role, that the caller may alter the table.
CREATE FUNCTION pglease._bind(tbl regclass, name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    owner oid;
BEGIN
    SELECT c.relowner INTO owner FROM pg_class AS c WHERE c.oid = _bind.tbl;
    IF owner IS NULL OR NOT pg_has_role(session_user, owner, 'MEMBER') THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('pglease: must be the owner of table %s to protect or unprotect it',
                             _bind.tbl);
    END IF;
    IF _bind.name IS NULL THEN
        DELETE FROM pglease._protected AS p WHERE p.tbl = _bind.tbl;
        RETURN FOUND;
    END IF;
    INSERT INTO pglease._protected AS p (tbl, name, protected_by, protected_at)
    VALUES (_bind.tbl, _bind.name, session_user, clock_timestamp())
    ON CONFLICT ON CONSTRAINT _protected_pkey DO UPDATE
        SET name = excluded.name, protected_by = excluded.protected_by,
            protected_at = excluded.protected_at;
    RETURN true;
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
                   'FOR EACH STATEMENT EXECUTE FUNCTION pglease._guard()', tbl);
    EXECUTE format('CREATE OR REPLACE TRIGGER pglease_protect_truncate BEFORE TRUNCATE ON %s '
                   'FOR EACH STATEMENT EXECUTE FUNCTION pglease._guard()', tbl);
    PERFORM pglease._bind(tbl, protect.name);
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
    RETURN pglease._bind(tbl, NULL) OR was;
END
$$;

COMMENT ON FUNCTION pglease.unprotect(regclass) IS
    'Remove the protection pglease.protect put on table TBL. Returns whether '
    'it was protected.';

-- Which tables are protected, by which lease (see pglease.protect), and
-- whether both guard triggers are as protect made them: BEFORE, for each
-- statement, pglease._guard, enabled, no WHEN clause, no column list
-- (tgtype 30: INSERT, DELETE, UPDATE; 34: TRUNCATE).
CREATE VIEW pglease.protected AS
SELECT p.tbl::regclass AS tbl, p.name,
       (SELECT count(*) FROM pg_trigger AS t
         WHERE t.tgrelid = p.tbl
           AND ((t.tgname = 'pglease_protect' AND t.tgtype = 30)
                OR (t.tgname = 'pglease_protect_truncate' AND t.tgtype = 34))
           AND t.tgfoid = 'pglease._guard()'::regprocedure
           AND t.tgenabled IN ('O', 'A') AND t.tgqual IS NULL AND t.tgattr = ''::int2vector)
           = 2 AS intact,
       p.protected_by, p.protected_at
  FROM pglease._protected AS p
  JOIN pg_class AS c ON c.oid = p.tbl;

COMMENT ON VIEW pglease.protected IS
    'Tables protected by pglease.protect, with their lease; intact is false when a guard '
    'trigger was dropped, disabled or replaced (then the table is not protected).';

------------------------------------------------------------------------
-- Declared sessions: a command's sessions that carry their lease.
------------------------------------------------------------------------

-- DECLARED SESSIONS. A session may declare, for its whole life, the lease
-- it acts under: the settings pglease.name and pglease.token, given when
-- it connects (PGOPTIONS='-c pglease.name=NAME -c pglease.token=T', or
-- the options of a URL; `pglease run --declare` gives them to every
-- session its command opens), so that a migration tool or a script is
-- fenced without a line of it changed. The declaration is a claim, never
-- a fact (any session can set those settings): each use of it is a call
-- of assert_held, which checks the token, the expiry on the database
-- clock and the session's role, and holds the check until commit. It is
-- used in two places only, so that a session that declares nothing pays
-- nothing:
--  - a protected table's guard, when the transaction declared no token
--    for the table's lease itself (_guard above);
--  - the DDL fence (opt-in, fence_ddl): each DDL command of a declared
--    session is checked as it starts; an undeclared session's DDL is not
--    checked at all.
-- A checked declared transaction is a fenced transaction: a takeover
-- ends it after FENCED_GRACE (see TAKEOVER FROM A FROZEN HOLDER).
--
-- A declared session can also pin the next holder outside any checked
-- transaction: a migration tool's own lock (sqlx's Migrator holds a
-- session-level advisory lock for its whole run; Liquibase keeps a lock
-- row) held by a deployer frozen between two migrations, or the row locks
-- of an unchecked transaction. So an acquisition that takes over a term
-- that ended without a release (it expired, or its holder's session
-- ended), and force_release, end the sessions of this database declared
-- under that term (_declared_pids, _end_declared), found two ways:
--  - by their SESSION MARKER: a session whose check under the term passed
--    holds, until it ends, a shared session-level advisory lock on a key
--    derived from the lease's secret, the term's token and its process id
--    (_session_marker; nobody without the secret can compute it, as with
--    the fenced marker);
--  - by their application_name, 'pglease:<token>' or 'pglease:<token> ...',
--    which `pglease run --declare` gives its command (PGAPPNAME): that finds
--    a session before its first check, as when a deployer froze right
--    after taking its tool's lock. It is a hint, never a fact: it is taken
--    only from sessions whose login role may act under the term's role
--    (another role's session would fail its first check anyway), and a
--    session can only name itself. Tokens are drawn from one sequence for
--    every lease, so a token names one term of one lease.
-- Each session is ended on its own, so that one the owner may not end
-- keeps nobody else's. Nothing is ended while the term it declared is
-- valid: these run only once that term has ended, under the row lock
-- that ends it.

-- The session marker of the session with process id PID checked under
-- term TOKEN of the lease with SECRET: as _marker, with a prefix that
-- keeps it apart from every transaction's marker. Per term: a session
-- that declares another term later (SET) is not ended with this one.
CREATE FUNCTION pglease._session_marker(secret bytea, token bigint, pid integer)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT ('x' || pg_catalog.encode(pg_catalog.substr(
               pg_catalog.sha256($1 || ('session ' || $2 || ' ' || $3)::bytea), 1, 8),
               'hex'))::bit(64)::bigint
$$;

-- A declared session's check, for lease LEASE: false when the session
-- declares no token for it (pglease.name is another lease, or unset);
-- otherwise assert_held under the declared token (22023 for a
-- pglease.token that is not a token), then the session marker, and true.
-- Called only by _guard and _fence_ddl, which run as the functions' owner
-- with a fixed search_path, so it needs no SECURITY DEFINER or SET of its
-- own (each would add its cost to every protected write of a declared
-- session).
CREATE FUNCTION pglease._check_session(lease text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    declared text;
BEGIN
    IF current_setting('pglease.name', true) IS DISTINCT FROM lease THEN
        RETURN false;
    END IF;
    declared := current_setting('pglease.token', true);
    IF declared IS NULL OR declared !~ '^[1-9][0-9]{0,18}$'
       OR declared::numeric > 9223372036854775807 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pglease: this session declares lease %L with pglease.token %L, '
                             'which is not a token (a positive whole number)', lease, declared);
    END IF;
    PERFORM pglease.assert_held(lease, declared::bigint);
    -- Shared and re-entrant: the same session's next check only counts
    -- it again. Nobody without the secret holds it exclusively; should
    -- it be held so all the same, the check fails rather than leave the
    -- session unmarked (as assert_held does with its own marker).
    IF NOT (SELECT pg_try_advisory_lock_shared(
                       pglease._session_marker(l.secret, declared::bigint, pg_backend_pid()))
              FROM pglease.leases AS l WHERE l.name = _check_session.lease) THEN
        RAISE EXCEPTION USING ERRCODE = '55P03',
            MESSAGE = format('pglease: lease %L: this session''s marker is held exclusively '
                             'by another session', lease);
    END IF;
    RETURN true;
END
$$;

REVOKE ALL ON FUNCTION pglease._check_session(text) FROM PUBLIC;

-- The DDL fence's event trigger (see fence_ddl): checks a declared
-- session's DDL command before it runs; returns at once for any other.
CREATE FUNCTION pglease._fence_ddl()
RETURNS event_trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lease text := nullif(current_setting('pglease.name', true), '');
BEGIN
    IF lease IS NOT NULL THEN
        PERFORM pglease._check_session(lease);
    END IF;
END
$$;

REVOKE ALL ON FUNCTION pglease._fence_ddl() FROM PUBLIC;

COMMENT ON FUNCTION pglease._fence_ddl() IS
    'Event trigger of the DDL fence (see pglease.fence_ddl): a declared session''s DDL '
    'command is checked as pglease.assert_held checks, before it runs.';

-- fence_ddl(true) turns the DDL fence on for this database: an event
-- trigger, pglease_fence_ddl, on ddl_command_start. fence_ddl(false)
-- turns it off. Returns whether it was on. Event triggers are the
-- superuser's (on managed services, the provider's administrator role,
-- such as rds_superuser, may create them); without it, 42501 says so, and
-- only protected tables fence declared sessions. An event trigger does
-- not fire for commands on objects shared by the whole server (databases,
-- roles, tablespaces), nor in single-user mode.
CREATE FUNCTION pglease.fence_ddl(fenced boolean)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    was boolean;
BEGIN
    IF fenced IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'fenced',
            MESSAGE = 'pglease: fenced must be true or false, got NULL';
    END IF;
    was := EXISTS (SELECT 1 FROM pg_event_trigger AS e WHERE e.evtname = 'pglease_fence_ddl');
    IF fenced AND NOT was THEN
        EXECUTE 'CREATE EVENT TRIGGER pglease_fence_ddl ON ddl_command_start '
                'EXECUTE FUNCTION pglease._fence_ddl()';
    ELSIF was AND NOT fenced THEN
        EXECUTE 'DROP EVENT TRIGGER pglease_fence_ddl';
    ELSIF was AND NOT pglease.ddl_fenced() THEN
        -- Disabled or replaced since: made as it should be.
        EXECUTE 'DROP EVENT TRIGGER pglease_fence_ddl';
        EXECUTE 'CREATE EVENT TRIGGER pglease_fence_ddl ON ddl_command_start '
                'EXECUTE FUNCTION pglease._fence_ddl()';
    END IF;
    RETURN was;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE EXCEPTION USING ERRCODE = '42501',
        MESSAGE = format('pglease: role %I may not turn the DDL fence %s: event triggers '
                         'are created and dropped by a superuser (on a managed service, '
                         'its administrator role, such as rds_superuser)', current_user,
                         CASE WHEN fenced THEN 'on' ELSE 'off' END),
        DETAIL = SQLERRM;
END
$$;

REVOKE ALL ON FUNCTION pglease.fence_ddl(boolean) FROM PUBLIC;

COMMENT ON FUNCTION pglease.fence_ddl(boolean) IS
    'Turn the DDL fence on (true) or off (false) for this database: each DDL command of '
    'a session that declares a lease (pglease.name, pglease.token) is checked as '
    'pglease.assert_held checks, before it runs. A superuser''s. Returns whether it was on.';

-- Whether the DDL fence is on and as fence_ddl made it: the event trigger
-- exists, fires (enabled for origin or always) on ddl_command_start, on
-- every command (no tag filter), and runs pglease._fence_ddl.
CREATE FUNCTION pglease.ddl_fenced()
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT EXISTS (SELECT 1 FROM pg_event_trigger AS e
                    WHERE e.evtname = 'pglease_fence_ddl' AND e.evtevent = 'ddl_command_start'
                      AND e.evtenabled IN ('O', 'A') AND e.evttags IS NULL
                      AND e.evtfoid = 'pglease._fence_ddl()'::regprocedure)
$$;

COMMENT ON FUNCTION pglease.ddl_fenced() IS
    'Whether the DDL fence (pglease.fence_ddl) is on and intact in this database.';

-- The version tables of the migration tools pglease knows, one row per
-- tool: protecting a tool's table for the deployers' lease makes a stale
-- deployer's migration transaction fail as it records itself (the tools
-- that record each migration in its own transaction). `pglease protect
-- --tool` and `pglease doctor` read this list (the library's copy,
-- pglease::migration_tools, is tested against it).
CREATE FUNCTION pglease.migration_tools()
RETURNS TABLE (tool text, version_table text)
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    VALUES ('sqlx', '_sqlx_migrations'),
           ('refinery', 'refinery_schema_history'),
           ('diesel', '__diesel_schema_migrations'),
           ('alembic', 'alembic_version'),
           ('flyway', 'flyway_schema_history'),
           ('golang-migrate', 'schema_migrations'),
           ('liquibase', 'databasechangelog')
$$;

-- The sessions in this database declared under term TOKEN of the lease
-- with SECRET, whose holder's role was ROLE (see DECLARED SESSIONS), and
-- how each was found: 'checked' (it holds the term's session marker) or
-- 'application_name' ('pglease:<TOKEN>', or that and a space first; only
-- sessions whose login role may act under ROLE: a name is a hint, and a
-- session of another role is refused at its first check anyway). The
-- activity snapshot is read afresh, so that no process id of an earlier
-- read, reused since, is taken.
CREATE FUNCTION pglease._declared_pids(secret bytea, token bigint, role name)
RETURNS TABLE (pid integer, found_by text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    db oid := (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database());
BEGIN
    PERFORM pg_stat_clear_snapshot();
    RETURN QUERY
    SELECT DISTINCT ON (f.pid) f.pid, f.found_by
      FROM (SELECT k.pid, 'checked' AS found_by
              FROM pg_locks AS k
             WHERE k.locktype = 'advisory' AND k.objsubid = 1 AND k.granted
               AND k.database = db AND k.pid <> pg_backend_pid()
               AND ((k.classid::bigint << 32) | k.objid::bigint)
                   = pglease._session_marker(_declared_pids.secret, _declared_pids.token, k.pid)
            UNION ALL
            SELECT a.pid, 'application_name'
              FROM pg_stat_get_activity(NULL) AS a
             WHERE a.datid = db AND a.pid <> pg_backend_pid()
               AND (a.application_name = 'pglease:' || _declared_pids.token
                    OR starts_with(a.application_name, 'pglease:' || _declared_pids.token || ' '))
               AND EXISTS (SELECT 1 FROM pg_roles AS r
                            WHERE r.rolname = _declared_pids.role
                              AND pg_has_role(a.usesysid, r.oid, 'MEMBER'))) AS f
     ORDER BY f.pid, f.found_by DESC;
END
$$;

-- (Callable by whoever may read pglease.declared, which calls it: it
-- finds nothing without a lease's secret, and ends nothing.)

-- Ends the sessions declared under lease NAME's term TOKEN, held by ROLE,
-- which has just ended (see DECLARED SESSIONS), each on its own: one that
-- the role that owns the functions may not end (a superuser's, or
-- another role's without pg_signal_backend) is named in a WARNING and
-- keeps nobody else's from being ended. Records the eviction. Internal:
-- it does not check that the term has ended, so nobody but the owner may
-- call it. The acquisition goes on either way: the next holder then
-- waits for what a session left open holds, as without declarations.
CREATE FUNCTION pglease._end_declared(name text, token bigint, role name)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    d      record;
    ended  text;
    kept   text;
BEGIN
    FOR d IN SELECT p.pid
               FROM pglease.leases AS l
              CROSS JOIN LATERAL pglease._declared_pids(l.secret, _end_declared.token,
                                                        _end_declared.role) AS p
              WHERE l.name = _end_declared.name
              ORDER BY p.pid LOOP
        BEGIN
            IF pg_terminate_backend(d.pid) THEN
                ended := concat_ws(', ', ended, d.pid);
            END IF;
        EXCEPTION WHEN insufficient_privilege THEN
            kept := concat_ws(', ', kept, d.pid);
        END;
    END LOOP;
    IF ended IS NOT NULL THEN
        PERFORM pglease._record(_end_declared.name, _end_declared.token, 'evicted', NULL,
                                clock_timestamp(), NULL, 'ended declared sessions ' || ended);
    END IF;
    IF kept IS NOT NULL THEN
        RAISE WARNING USING MESSAGE = format(
            'pglease: lease %L: sessions %s, declared under its ended token %s, are still '
            'open: role %I, which owns the pglease functions, may not end them; a superuser '
            'can allow it: GRANT pg_signal_backend TO %I (sessions of superusers only a '
            'superuser can end)', _end_declared.name, kept, _end_declared.token, current_user,
            current_user);
    END IF;
END
$$;

REVOKE ALL ON FUNCTION pglease._end_declared(text, bigint, name) FROM PUBLIC;

-- The sessions that declare a lease's current term (see DECLARED
-- SESSIONS), as far as others can see them: by the session marker of a
-- check under that term, or by their application_name. For people, like
-- pglease.fenced.
CREATE VIEW pglease.declared AS
SELECT l.name, d.pid, d.found_by
  FROM pglease.leases AS l
 CROSS JOIN LATERAL pglease._declared_pids(l.secret, l.token, l.role) AS d
 WHERE l.holder IS NOT NULL;

COMMENT ON VIEW pglease.declared IS
    'Sessions (pid) that declare a held lease''s current term: found by the marker a check '
    'under that term took, or by an application_name pglease:<token>. A takeover of a term '
    'that ended without a release ends the sessions declared under it.';

------------------------------------------------------------------------
-- admit(resource, token): separate-resource fencing.
------------------------------------------------------------------------

CREATE FUNCTION pglease.admit(resource text, token bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked       text;
    checked_token bigint;
    highest       bigint;
    accepted      boolean;
    here          pglease._checked;
BEGIN
    checked := pglease._check_text('resource', admit.resource);
    checked_token := pglease._check_token(admit.token);
    IF admit.token <= 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'token',
            MESSAGE = format('pglease: token must be positive, got %s', admit.token);
    END IF;

    -- Tokens are judged against a fence that has moved past a change of
    -- timeline, if there was one (see TIMELINES).
    IF pg_is_in_recovery() THEN
        PERFORM pglease._refuse_standby('admit a token to a high-water mark');
    END IF;
    SELECT * INTO here FROM pglease._checked;
    IF NOT FOUND THEN
        here := pglease._timeline_checked(NULL);
        IF here.timeline IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = '55P03',
                MESSAGE = 'pglease: another transaction checking the server''s timeline has '
                          'not committed for 1 s; try again';
        END IF;
    END IF;

    -- A token never issued would raise the mark above every real one.
    IF admit.token > (SELECT CASE WHEN q.is_called THEN q.last_value ELSE 0 END
                          FROM pglease.fence_seq AS q) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'token',
            MESSAGE = format('pglease: token %s has never been issued (the latest token issued '
                             'is %s)', admit.token,
                             (SELECT CASE WHEN q.is_called THEN q.last_value ELSE 0 END
                                FROM pglease.fence_seq AS q));
    END IF;

    -- A token drawn before the latest change of timeline is accepted only
    -- while its lease, valid at the change, is held under it: the mark
    -- itself may have gone back (see HIGH-WATER MARKS).
    IF admit.token <= here.floor
       AND NOT EXISTS (SELECT 1 FROM pglease._carried AS c
                         JOIN pglease.leases AS l ON l.name = c.name
                        WHERE c.token = admit.token AND l.token = admit.token
                          AND l.holder IS NOT NULL AND clock_timestamp() < l.expires_at) THEN
        RETURN false;
    END IF;

    -- Read-only answers when nothing would change.
    SELECT f.token INTO highest FROM pglease.fences AS f WHERE f.resource = admit.resource;
    IF FOUND AND highest > admit.token THEN
        RETURN false;
    END IF;
    IF FOUND AND highest = admit.token THEN
        RETURN true;
    END IF;

    -- A high-water mark that went backwards after a crash would accept an
    -- old token again: this commit must be durable.
    PERFORM pglease._durable();
    INSERT INTO pglease.fences AS f (resource, token, advanced_at)
    VALUES (admit.resource, admit.token, clock_timestamp())
    ON CONFLICT ON CONSTRAINT fences_pkey DO UPDATE
        SET token = excluded.token, advanced_at = excluded.advanced_at
        WHERE f.token <= excluded.token
    RETURNING true INTO accepted;
    RETURN coalesce(accepted, false);
END
$$;

COMMENT ON FUNCTION pglease.admit(text, bigint) IS
    'Separate-resource fencing: accept TOKEN for RESOURCE iff it is >= the highest '
    'token accepted so far, and record it. Returns true if accepted; a token never '
    'issued is an error (22023). After a change of timeline (pglease.timelines), a token '
    'drawn before it is accepted only while its lease is held under it.';
