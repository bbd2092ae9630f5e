-- pglease: bounded takeover from a frozen holder, and protect for owners only.
--
-- THE PROBLEM. A fenced transaction holds FOR KEY SHARE on its lease's row
-- until it ends (see LOCKS in 0001_core.sql), and an acquisition needs FOR
-- UPDATE. Until now an acquisition of an expired lease waited for such a
-- transaction to end, however long that took: a holder frozen inside a
-- fenced transaction (a stopped process, a paused VM, a silent network)
-- kept its lease from everyone, although it had expired.
--
-- WHAT CHANGES. A transaction fenced on a lease now also marks itself,
-- visibly: assert_held takes a shared transaction-level advisory lock on
-- (1886152293, id) (key space 0x706c6665, "plfe"), where id is the lease's
-- own number (a new column, unique and never reused: rows are never
-- deleted). It is held until the transaction ends, like the row lock, and
-- pg_locks shows which sessions hold it (view pglease.fenced).
--
-- acquire, when it finds the row locked, takes FOR NO KEY UPDATE, which
-- conflicts with another acquirer, a renewal or a release (short) and never
-- with a fenced transaction; while it holds that lock nobody can renew,
-- release or acquire the lease, so its decision cannot go stale. If the
-- lease is still valid, it reports it held. If the lease has ended (expired
-- or released), every transaction still fenced on it declared a token that
-- is no longer valid: acquire ends their sessions (pg_terminate_backend),
-- so that they roll back and never commit, and takes the lease as soon as
-- their locks are gone.
--
-- NO WAIT WITHOUT BOUND. acquire takes these locks with SKIP LOCKED and
-- polls (every 2 ms) instead of queueing, for at most TAKEOVER_GRACE (1 s,
-- the one literal below) per stage: an attempt answers within about 2 s
-- whatever holds the row. When it cannot finish, it returns "not acquired"
-- with a WARNING that says why: it may not end the stale sessions, the row
-- is locked by something it cannot end (a prepared transaction, a lock
-- taken without assert_held), or an acquisition, renewal or release of the
-- lease has stayed uncommitted. In that last case, when the lease has
-- ended on its committed row, it first ends the transactions fenced on the
-- lease and waits one more grace: a fenced transaction that renewed or
-- released the lease itself and then froze holds the row that way (renew
-- and release belong in transactions of their own).
--
-- SAFETY. Nothing is ended while its lease is valid on its committed row:
-- the decision is made on the database clock, and, but for the case just
-- described, while renewals are held off. A holder that keeps renewing
-- keeps its fenced transactions for as long as it likes. Only sessions
-- holding the marker of *this* lease are ended (its id, not a hash), never
-- the acquirer's own; a session is ended as a whole, with whatever else its
-- transaction did, and a session whose fenced transaction ends in the
-- microseconds between the look-up in pg_locks and the signal is ended all
-- the same.

-- PRIVILEGE. pg_terminate_backend runs with the rights of the role that owns
-- these functions (they are SECURITY DEFINER). It may end the sessions of
-- roles it has the privileges of, or any non-superuser session if it has
-- the privileges of pg_signal_backend; sessions of superusers only if it is
-- a superuser itself. pglease.can_end_stale_transactions() tells whether the
-- owner is a superuser or has pg_signal_backend; `pglease migrate` warns
-- when it is neither. Without the privilege, an expired lease pinned by a
-- frozen holder's transaction stays pinned until that transaction ends (bound
-- it with idle_in_transaction_session_timeout / statement_timeout), and each
-- acquire says so with a WARNING instead of waiting.
--
-- protect and unprotect now require ownership of the table (or the
-- privileges of its owning role), not only the TRIGGER privilege: a role
-- granted TRIGGER (GRANT ALL includes it) could otherwise point a table's
-- fence at a lease it controls.

------------------------------------------------------------------------
-- The lease's own number, for the fencing marker.
------------------------------------------------------------------------

-- integer, because an advisory lock key has 32 bits; NO CYCLE, so that a
-- number is never given to two names (creating a name fails after
-- 2,147,483,647 names instead). Unique by construction (only the
-- functions write the table, and rows are never deleted), and not
-- indexed: every acquisition's update inserts into every index of the
-- table (it changes the token, so it is never a HOT update), and one more
-- unique index made the benchmark's acquire + release cycle measurably
-- slower on a hot name. Nothing looks a lease up by its number but the
-- view pglease.fenced.
CREATE SEQUENCE pglease.lease_id_seq AS integer START WITH 1 NO CYCLE;

ALTER TABLE pglease.leases
    ADD COLUMN id integer NOT NULL DEFAULT nextval('pglease.lease_id_seq');

ALTER SEQUENCE pglease.lease_id_seq OWNED BY pglease.leases.id;

REVOKE ALL ON pglease.lease_id_seq FROM PUBLIC;

COMMENT ON COLUMN pglease.leases.id IS
    'The lease''s own number: fenced transactions hold the shared advisory lock '
    '(1886152293, id) until they end (view pglease.fenced).';

------------------------------------------------------------------------
-- Why an attempt was not acquired, in its answer.
------------------------------------------------------------------------

-- acquire's answer gains a column: NULL, except when the lease has ended
-- but could not be taken, where it says why (the same text as the WARNING,
-- for callers who cannot read the server's log).
ALTER TYPE pglease.acquisition ADD ATTRIBUTE note text;

------------------------------------------------------------------------
-- _end_fenced(name, lease_id): end the sessions fenced on a lease.
------------------------------------------------------------------------

-- Ends every session (but this one) that holds the marker of lease_id.
-- Returns NULL, or, when the role that owns the functions may not end one
-- of them, why. Internal: it does not check that the lease has ended, so
-- nobody but the owner may call it.
CREATE FUNCTION pglease._end_fenced(name text, lease_id integer)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    db   oid := (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database());
    note text;
BEGIN
    -- One statement, so that the look-up and the signals are as close
    -- together as they can be. The sessions roll back and exit; their
    -- locks go with them.
    PERFORM pg_terminate_backend(k.pid)
       FROM pg_locks AS k
      WHERE k.locktype = 'advisory' AND k.database = db
        AND k.classid = 1886152293 AND k.objid = lease_id::oid AND k.objsubid = 2
        AND k.granted AND k.pid <> pg_backend_pid();
    RETURN NULL;
EXCEPTION WHEN insufficient_privilege THEN
    note := format('sessions %s are fenced on it under an earlier token, and role %I, which '
                   'owns the pglease functions, may not end them (%s); a superuser can allow '
                   'it: GRANT pg_signal_backend TO %I (sessions of superusers only a superuser '
                   'can end)',
                   (SELECT string_agg(k.pid::text, ', ' ORDER BY k.pid) FROM pg_locks AS k
                     WHERE k.locktype = 'advisory' AND k.database = db
                       AND k.classid = 1886152293 AND k.objid = lease_id::oid
                       AND k.objsubid = 2 AND k.granted AND k.pid <> pg_backend_pid()),
                   current_user, SQLERRM, current_user);
    RETURN note;
END
$$;

REVOKE ALL ON FUNCTION pglease._end_fenced(text, integer) FROM PUBLIC;

------------------------------------------------------------------------
-- _take_over(name): lock an ended lease from its stale holders.
------------------------------------------------------------------------

-- Called by acquire only, once FOR UPDATE SKIP LOCKED has found the row
-- locked by someone else. Returns NULL when this transaction holds FOR
-- UPDATE on the row and the lease has ended; '' when the lease is held
-- (valid); otherwise why it cannot be taken within the grace. See the top
-- of this file.
CREATE FUNCTION pglease._take_over(name text)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- TAKEOVER_GRACE: how long each stage may wait for locks to go.
    give_up    timestamptz := clock_timestamp() + interval '1 second';
    ended_them boolean := false;
    cur_holder text;
    cur_expiry timestamptz;
    cur_id     integer;
    note       text;
BEGIN
    LOOP
        SELECT l.holder, l.expires_at, l.id INTO cur_holder, cur_expiry, cur_id
          FROM pglease.leases AS l WHERE l.name = _take_over.name FOR NO KEY UPDATE SKIP LOCKED;
        IF FOUND THEN
            -- Nobody can renew, release or acquire the lease now: decide.
            IF cur_holder IS NOT NULL AND clock_timestamp() < cur_expiry THEN
                RETURN '';
            END IF;
            -- It has ended: the transactions still fenced on it are stale.
            LOOP
                PERFORM 1 FROM pglease.leases AS l
                 WHERE l.name = _take_over.name FOR UPDATE SKIP LOCKED;
                IF FOUND THEN
                    RETURN NULL;
                END IF;
                note := pglease._end_fenced(_take_over.name, cur_id);
                IF note IS NOT NULL THEN
                    RETURN note;
                END IF;
                IF clock_timestamp() >= give_up THEN
                    RETURN 'its row is still locked after 1 s by a transaction that pglease '
                           'cannot end: one that locked the row without pglease.assert_held, '
                           'a prepared transaction, or a session that does not exit';
                END IF;
                PERFORM pg_sleep(0.002);
            END LOOP;
        END IF;
        -- An acquisition, renewal or release of the lease has not committed
        -- yet (usually a matter of milliseconds). Meanwhile, a lease that
        -- is valid on its committed row is simply held.
        SELECT l.holder, l.expires_at, l.id INTO cur_holder, cur_expiry, cur_id
          FROM pglease.leases AS l WHERE l.name = _take_over.name;
        IF cur_holder IS NOT NULL AND clock_timestamp() < cur_expiry THEN
            RETURN '';
        END IF;
        IF clock_timestamp() >= give_up THEN
            IF ended_them THEN
                RETURN 'its row has been locked for over 1 s by an acquisition, renewal or '
                       'release of it that has not committed (a transaction left open: call '
                       'acquire, renew and release in transactions of their own)';
            END IF;
            -- Ended on its committed row for the whole grace: a fenced
            -- transaction that renewed or released the lease itself and
            -- froze holds the row so. End the fenced ones; wait once more.
            note := pglease._end_fenced(_take_over.name, cur_id);
            IF note IS NOT NULL THEN
                RETURN note;
            END IF;
            ended_them := true;
            give_up := clock_timestamp() + interval '1 second';
        END IF;
        PERFORM pg_sleep(0.002);
    END LOOP;
END
$$;

REVOKE ALL ON FUNCTION pglease._take_over(text) FROM PUBLIC;

COMMENT ON FUNCTION pglease._take_over(text) IS
    'Internal to pglease.acquire: lock an ended lease FOR UPDATE, ending the sessions '
    'still fenced on it, within about 2 s; otherwise say why not.';

------------------------------------------------------------------------
-- acquire(name, holder, ttl)
------------------------------------------------------------------------

-- As in 0004_lean_checks.sql, except for the locking once the fast path has
-- found the lease free or expired: FOR UPDATE SKIP LOCKED when nobody else
-- locks the row (the usual case, one row lock as before); otherwise
-- _take_over.
CREATE OR REPLACE FUNCTION pglease.acquire(name text, holder text, ttl interval)
RETURNS pglease.acquisition
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    seconds    numeric := extract(epoch FROM acquire.ttl);
    checked    text;
    cur_holder text;
    cur_expiry timestamptz;
    found_row  boolean;
    note       text;
    t          timestamptz;
    result     pglease.acquisition;
BEGIN
    IF NOT coalesce(octet_length(acquire.name) BETWEEN 1 AND 255
                    AND octet_length(acquire.holder) BETWEEN 1 AND 255
                    AND seconds > 0 AND seconds <= 604800, false) THEN
        checked := pglease._check_text('name', acquire.name);
        checked := pglease._check_text('holder', acquire.holder);
        PERFORM pglease._check_ttl(acquire.ttl);
    END IF;

    -- Fast path, read-only: a held, unexpired lease is reported without a
    -- row lock, a token, WAL or a commit flush, also while fenced
    -- transactions hold it.
    SELECT l.holder, l.expires_at INTO cur_holder, cur_expiry
      FROM pglease.leases AS l WHERE l.name = acquire.name;
    found_row := FOUND;
    t := clock_timestamp();
    IF cur_holder IS NOT NULL AND t < cur_expiry THEN
        RETURN ROW(NULL, cur_expiry, cur_holder, t, NULL)::pglease.acquisition;
    END IF;

    IF NOT found_row THEN
        -- First acquisition of this name (see 0001_core.sql for why
        -- creators take turns).
        PERFORM pg_advisory_xact_lock(1886152033, hashtext(acquire.name));
        INSERT INTO pglease.leases AS l (name, holder, token, expires_at, acquired_at)
        VALUES (acquire.name, NULL, 0, '-infinity', clock_timestamp())
        ON CONFLICT ON CONSTRAINT leases_pkey DO NOTHING;
    END IF;

    -- Usually nobody else locks the row: take FOR UPDATE at once.
    SELECT l.holder, l.expires_at INTO cur_holder, cur_expiry
      FROM pglease.leases AS l WHERE l.name = acquire.name FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        note := pglease._take_over(acquire.name);
        -- Either way, the committed row: locked by this transaction if
        -- taken; otherwise it says who holds the lease, or, if the lease
        -- has ended (expires_at <= checked_at, or holder NULL), that a
        -- transaction that could not be ended pins it, and note says why.
        SELECT l.holder, l.expires_at INTO cur_holder, cur_expiry
          FROM pglease.leases AS l WHERE l.name = acquire.name;
        IF note IS NOT NULL THEN
            IF note <> '' THEN
                -- For the server's log (the caller gets it in the answer).
                RAISE WARNING USING MESSAGE = format('pglease: lease %L has ended, but %s',
                                                     acquire.name, note);
            END IF;
            RETURN ROW(NULL, cur_expiry, cur_holder, clock_timestamp(),
                       nullif(note, ''))::pglease.acquisition;
        END IF;
    END IF;
    -- Decide on the latest row version and a clock read after the lock.
    t := clock_timestamp();
    IF cur_holder IS NOT NULL AND t < cur_expiry THEN
        RETURN ROW(NULL, cur_expiry, cur_holder, t, NULL)::pglease.acquisition;
    END IF;

    -- Durable whatever the session's synchronous_commit (see DURABILITY
    -- in 0001_core.sql).
    IF current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    -- The token is drawn only now, while this transaction holds the row
    -- lock: for each name, tokens strictly increase in commit order.
    UPDATE pglease.leases AS l
       SET holder = acquire.holder,
           token = nextval('pglease.fence_seq'),
           expires_at = t + make_interval(secs => seconds::double precision),
           acquired_at = t,
           renewed_at = NULL,
           released_at = NULL
     WHERE l.name = acquire.name
    RETURNING l.token, l.expires_at INTO result.token, result.expires_at;
    result.holder := acquire.holder;
    result.checked_at := t;
    RETURN result;
END
$$;

COMMENT ON FUNCTION pglease.acquire(text, text, interval) IS
    'Acquire lease NAME for HOLDER for TTL if it is free or expired, ending the '
    'sessions of transactions still fenced on an ended lease. Answers within about 2 s. Returns '
    '(token, expires_at, holder, checked_at, note); token is NULL when not acquired, and '
    'then expires_at and holder describe the current holder (expires_at <= checked_at: '
    'the lease has ended but a transaction that could not be ended still holds it, and '
    'note says why).';

------------------------------------------------------------------------
-- assert_held(name, token)
------------------------------------------------------------------------

-- As in 0004_lean_checks.sql, plus the marker by which an acquisition
-- after the lease has ended finds this transaction (and ends it): the
-- shared advisory lock (1886152293, id) until the transaction ends. The
-- guard trigger of protected tables calls this again at each write; taking
-- a lock this transaction already holds costs a look-up in the session's
-- own lock table.
CREATE OR REPLACE FUNCTION pglease.assert_held(name text, token bigint)
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
    IF NOT coalesce(octet_length(assert_held.name) BETWEEN 1 AND 255
                    AND assert_held.token IS NOT NULL, false) THEN
        checked := pglease._check_text('name', assert_held.name);
        PERFORM pglease._check_token(assert_held.token);
    END IF;

    -- FOR KEY SHARE lasts until the caller's transaction ends and blocks
    -- the key update every acquisition makes (see LOCKS in 0001_core.sql).
    SELECT l.token, l.holder, l.expires_at, l.released_at, l.id
      INTO cur_token, cur_holder, cur_expiry, cur_released, cur_id
      FROM pglease.leases AS l WHERE l.name = assert_held.name FOR KEY SHARE;
    -- The clock is read after the lock is held.
    t := clock_timestamp();
    IF NOT (FOUND AND cur_token = assert_held.token AND cur_token <> 0
            AND cur_holder IS NOT NULL AND t < cur_expiry) THEN
        IF NOT FOUND OR cur_token = 0 THEN
            RAISE EXCEPTION USING ERRCODE = 'LE001',
                MESSAGE = format('pglease: lease %L is not held: it has never been acquired',
                                 assert_held.name);
        END IF;
        IF cur_token <> assert_held.token THEN
            RAISE EXCEPTION USING ERRCODE = 'LE001',
                MESSAGE = format('pglease: lease %L is not held under token %s: %s',
                                 assert_held.name, assert_held.token,
                                 CASE WHEN assert_held.token < cur_token
                                      THEN format('the token is stale, the lease was acquired again with token %s', cur_token)
                                      ELSE 'no such token has been issued for this lease' END);
        END IF;
        IF cur_holder IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'LE001',
                MESSAGE = format('pglease: lease %L is not held under token %s: it was released at %s',
                                 assert_held.name, assert_held.token, cur_released);
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'LE001',
            MESSAGE = format('pglease: lease %L is not held under token %s: it expired at %s (database time now %s)',
                             assert_held.name, assert_held.token, cur_expiry, t);
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

------------------------------------------------------------------------
-- fenced: which sessions are fenced on which lease right now.
------------------------------------------------------------------------

CREATE VIEW pglease.fenced AS
SELECT l.name, k.pid
  FROM pg_locks AS k
  JOIN pglease.leases AS l ON k.objid = l.id::oid
 WHERE k.locktype = 'advisory'
   AND k.database = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())
   AND k.classid = 1886152293 AND k.objsubid = 2 AND k.granted;

-- (Without an index on id the join reads the whole leases table: a tenth
-- of a second or so for a million leases, acceptable for a view that
-- people, not the functions, query.)
COMMENT ON VIEW pglease.fenced IS
    'Sessions (pid) with an open transaction fenced on each lease (pglease.assert_held). '
    'An acquisition after the lease has ended ends these sessions.';

------------------------------------------------------------------------
-- can_end_stale_transactions(): does the owner have the privilege?
------------------------------------------------------------------------

-- SECURITY DEFINER, so current_user is the role that owns the functions
-- (the role acquire ends sessions as).
CREATE FUNCTION pglease.can_end_stale_transactions()
RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT r.rolsuper OR pg_has_role(r.oid, 'pg_signal_backend', 'USAGE')
      FROM pg_roles AS r WHERE r.rolname = current_user
$$;

COMMENT ON FUNCTION pglease.can_end_stale_transactions() IS
    'Whether the role that owns the pglease functions is a superuser or has the '
    'privileges of pg_signal_backend, so that an acquisition can end the sessions of '
    'stale fenced transactions (of superusers: only if it is a superuser).';

------------------------------------------------------------------------
-- protect / unprotect: the table's owner only.
------------------------------------------------------------------------

-- The same bodies as in 0003_protect.sql, with the ownership check first.
CREATE OR REPLACE FUNCTION pglease.protect(tbl regclass, name text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked text;
    owner   oid;
BEGIN
    IF tbl IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'pglease: tbl must not be NULL';
    END IF;
    checked := pglease._check_text('name', protect.name);
    SELECT c.relowner INTO owner FROM pg_class AS c WHERE c.oid = tbl;
    -- Runs with the caller's rights: the caller must own the table (or
    -- have the privileges of its owning role), as ALTER TABLE requires.
    -- The TRIGGER privilege alone is not enough.
    IF owner IS NOT NULL AND NOT pg_has_role(current_user, owner, 'USAGE') THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('pglease: must be the owner of table %s to protect it', tbl);
    END IF;
    IF (SELECT c.relkind FROM pg_class AS c WHERE c.oid = tbl) IS DISTINCT FROM 'r' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pglease: tbl %s is not an ordinary table', tbl);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_inherits AS i WHERE i.inhrelid = tbl OR i.inhparent = tbl) THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pglease: tbl %s is part of a partition or inheritance tree, '
                             'which protect does not cover', tbl);
    END IF;
    EXECUTE format('CREATE OR REPLACE TRIGGER pglease_protect BEFORE INSERT OR UPDATE OR DELETE ON %s '
                   'FOR EACH STATEMENT EXECUTE FUNCTION pglease._guard(%L)', tbl, protect.name);
    EXECUTE format('CREATE OR REPLACE TRIGGER pglease_protect_truncate BEFORE TRUNCATE ON %s '
                   'FOR EACH STATEMENT EXECUTE FUNCTION pglease._guard(%L)', tbl, protect.name);
END
$$;

CREATE OR REPLACE FUNCTION pglease.unprotect(tbl regclass)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    was   boolean;
    owner oid;
BEGIN
    IF tbl IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'pglease: tbl must not be NULL';
    END IF;
    SELECT c.relowner INTO owner FROM pg_class AS c WHERE c.oid = tbl;
    IF owner IS NOT NULL AND NOT pg_has_role(current_user, owner, 'USAGE') THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('pglease: must be the owner of table %s to unprotect it', tbl);
    END IF;
    was := EXISTS (SELECT 1 FROM pg_trigger AS t
                    WHERE t.tgrelid = tbl AND t.tgname = 'pglease_protect');
    EXECUTE format('DROP TRIGGER IF EXISTS pglease_protect ON %s', tbl);
    EXECUTE format('DROP TRIGGER IF EXISTS pglease_protect_truncate ON %s', tbl);
    RETURN was;
END
$$;
