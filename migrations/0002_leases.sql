-- pglease: taking, keeping and giving up leases.
--
-- acquire, renew, renew_many and release are each one statement from the
-- client, so their cost is the server's work inside the call: they test
-- all their arguments in one expression (the helpers of 0001_schema.sql
-- run only when it fails, for the exact message), read only the columns
-- they decide on, and raise synchronous_commit inline.
--
-- The CLOCK, LOCKS, DURABILITY and PRIVILEGES rules of 0001_schema.sql
-- apply to every function here.

------------------------------------------------------------------------
-- acquire(name, holder, ttl): acquire if free or ended, within about 2 s.
------------------------------------------------------------------------

-- TAKEOVER FROM A FROZEN HOLDER. A fenced transaction holds FOR KEY SHARE
-- on its lease's row until it ends (see LOCKS in 0001_schema.sql), and an
-- acquisition needs FOR UPDATE. Waiting for such a transaction would let a
-- holder frozen inside it (a stopped process, a paused VM, a silent
-- network) keep an expired lease from everyone. So a fenced transaction
-- also marks itself, visibly: assert_held takes a shared transaction-level
-- advisory lock on (1886152293, id), id being the lease's own number,
-- held until the transaction ends (view pglease.fenced).
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
-- in _take_over) per stage: an attempt answers within about 2 s whatever
-- holds the row. When it cannot finish, it returns "not acquired" with a
-- WARNING and a note that say why: it may not end the stale sessions, the
-- row is locked by something it cannot end (a prepared transaction, a lock
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
--
-- PRIVILEGE. pg_terminate_backend runs with the rights of the role that
-- owns these functions. It may end the sessions of roles it has the
-- privileges of, or any non-superuser session if it has the privileges of
-- pg_signal_backend; sessions of superusers only if it is a superuser
-- itself. pglease.can_end_stale_transactions() tells which; `pglease
-- migrate` warns when the owner may not. Without the privilege, an expired
-- lease pinned by a frozen holder's transaction stays pinned until that
-- transaction ends (bound it with idle_in_transaction_session_timeout /
-- statement_timeout), and each acquire says so instead of waiting.

-- Ends every session (but this one) that holds the marker of lease_id.
-- Returns NULL, or, when the role that owns the functions may not end one
-- of them, why. The process ids it ended are kept in the transaction's
-- setting pglease.evicted ("<lease id>:<pids>"), which the history reads
-- (0006_history.sql). Internal: it does not check that the lease has
-- ended, so nobody but the owner may call it.
CREATE FUNCTION pglease._end_fenced(name text, lease_id integer)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    db    oid := (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database());
    ended text;
    note  text;
BEGIN
    -- One statement, so that the look-up and the signals are as close
    -- together as they can be. The sessions roll back and exit; their
    -- locks go with them.
    -- (The signal is in the aggregate's FILTER, evaluated only for the
    -- rows that pass WHERE, whatever order the planner tests WHERE in.)
    SELECT string_agg(k.pid::text, ', ' ORDER BY k.pid)
               FILTER (WHERE pg_terminate_backend(k.pid)) INTO ended
      FROM pg_locks AS k
     WHERE k.locktype = 'advisory' AND k.database = db
       AND k.classid = 1886152293 AND k.objid = lease_id::oid AND k.objsubid = 2
       AND k.granted AND k.pid <> pg_backend_pid();
    IF ended IS NOT NULL THEN
        -- "<lease id>:<pids>", added to what an earlier call ended for the
        -- same lease in this transaction.
        PERFORM set_config('pglease.evicted',
                           CASE WHEN split_part(current_setting('pglease.evicted', true), ':', 1)
                                     = lease_id::text
                                THEN current_setting('pglease.evicted', true) || ', ' || ended
                                ELSE lease_id::text || ':' || ended END,
                           true);
    END IF;
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

CREATE FUNCTION pglease.acquire(name text, holder text, ttl interval)
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
    IF NOT coalesce(octet_length(acquire.name) BETWEEN 1 AND pglease._max_text_bytes()
                    AND octet_length(acquire.holder) BETWEEN 1 AND pglease._max_text_bytes()
                    AND seconds > 0 AND seconds <= pglease._max_ttl_seconds(), false) THEN
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
        -- First acquisition of this name: create the row with token 0.
        -- Creators of one name take turns (a transaction-level advisory
        -- lock on the name's hash, key space 0x706c6561): two speculative
        -- inserts racing on the primary key, followed by the winner's key
        -- update (which inserts a new primary-key entry), can otherwise
        -- deadlock. The second creator then finds the committed row,
        -- inserts nothing, and locks that row below.
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
    -- in 0001_schema.sql).
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
-- renew(name, token, ttl): extend a valid lease to database-now + ttl.
------------------------------------------------------------------------

CREATE FUNCTION pglease.renew(name text, token bigint, ttl interval)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    seconds    numeric := extract(epoch FROM renew.ttl);
    checked    text;
    new_expiry timestamptz;
BEGIN
    IF NOT coalesce(octet_length(renew.name) BETWEEN 1 AND pglease._max_text_bytes()
                    AND renew.token IS NOT NULL
                    AND seconds > 0 AND seconds <= pglease._max_ttl_seconds(), false) THEN
        checked := pglease._check_text('name', renew.name);
        PERFORM pglease._check_token(renew.token);
        PERFORM pglease._check_ttl(renew.ttl);
    END IF;

    -- The WHERE clause is evaluated again, with a fresh clock, if the
    -- update has to wait for a concurrent acquirer.
    UPDATE pglease.leases AS l
       SET expires_at = clock_timestamp() + make_interval(secs => seconds::double precision),
           renewed_at = clock_timestamp()
     WHERE l.name = renew.name
       AND l.token = renew.token
       AND l.holder IS NOT NULL
       AND clock_timestamp() < l.expires_at
    RETURNING l.expires_at INTO new_expiry;
    RETURN new_expiry; -- NULL: stale token, released, expired or unknown
END
$$;

COMMENT ON FUNCTION pglease.renew(text, bigint, interval) IS
    'Extend lease NAME held under TOKEN to database-now + TTL. Returns the new '
    'expires_at, or NULL if the lease is lost (stale token, released, expired).';

------------------------------------------------------------------------
-- renew_many(names, tokens, ttls): renew[i] = renew(names[i], tokens[i], ttls[i])
------------------------------------------------------------------------

-- Many leases in one statement and one commit, so that a process holding
-- a thousand leases pays one round trip per renewal tick, not a thousand.
-- It decides with clock_timestamp() at each row update and takes the same
-- row lock as renew.
--
-- One row per lease renewed, with renewed = true and the new expires_at,
-- then one row per element not renewed, with renewed = false and the
-- current_token and current_holder of the row as found (current_token NULL:
-- the name was never acquired), so that the caller can tell a takeover from
-- a release or an expiry. A name may appear more than once: only elements
-- with the current token are renewed, and equal elements renew the lease
-- once (and yield one row).
CREATE FUNCTION pglease.renew_many(names text[], tokens bigint[], ttls interval[])
RETURNS TABLE (name text, token bigint, expires_at timestamptz, renewed boolean,
               current_token bigint, current_holder text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    bad         record;
    checked     text;
    column_name text;
    r_names    text[];
    r_tokens   bigint[];
    r_expiries timestamptz[];
BEGIN
    IF names IS NULL OR tokens IS NULL OR ttls IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'names',
            MESSAGE = 'pglease: names, tokens and ttls must not be NULL';
    END IF;
    IF cardinality(names) <> cardinality(tokens) OR cardinality(names) <> cardinality(ttls) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'names',
            MESSAGE = format('pglease: names, tokens and ttls must have the same length, got %s, %s and %s',
                             cardinality(names), cardinality(tokens), cardinality(ttls));
    END IF;

    -- Validation is set-based (one scan of the arguments, in double
    -- precision rather than numeric); only the first bad element goes
    -- through the scalar checks, for their exact message.
    SELECT u.ord, u.n, u.t, u.ttl INTO bad
      FROM unnest(names, tokens, ttls) WITH ORDINALITY AS u(n, t, ttl, ord)
     WHERE u.n IS NULL OR octet_length(u.n) NOT BETWEEN 1 AND pglease._max_text_bytes()
        OR u.t IS NULL OR u.ttl IS NULL
        OR date_part('epoch', u.ttl) <= 0 OR date_part('epoch', u.ttl) > pglease._max_ttl_seconds()
     ORDER BY u.ord
     LIMIT 1;
    IF FOUND THEN
        BEGIN
            checked := pglease._check_text('name', bad.n);
            PERFORM pglease._check_token(bad.t);
            PERFORM pglease._check_ttl(bad.ttl);
        EXCEPTION WHEN invalid_parameter_value THEN
            GET STACKED DIAGNOSTICS column_name = COLUMN_NAME;
            RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = column_name,
                MESSAGE = replace(SQLERRM, 'pglease: ', format('pglease: element %s: ', bad.ord));
        END;
    END IF;

    -- One UPDATE for the whole batch, with the same condition as renew and
    -- the TTL in exact seconds; it is joined on the primary key. What it
    -- renewed is kept, to tell the rest apart exactly.
    WITH upd AS (
        UPDATE pglease.leases AS l
           SET expires_at = clock_timestamp() + make_interval(secs => date_part('epoch', u.ttl)),
               renewed_at = clock_timestamp()
          FROM unnest(names, tokens, ttls) AS u(n, t, ttl)
         WHERE l.name = u.n
           AND l.token = u.t
           AND l.holder IS NOT NULL
           AND clock_timestamp() < l.expires_at
        RETURNING l.name, l.token, l.expires_at
    )
    SELECT coalesce(array_agg(upd.name), '{}'), coalesce(array_agg(upd.token), '{}'),
           coalesce(array_agg(upd.expires_at), '{}')
      INTO r_names, r_tokens, r_expiries
      FROM upd;
    RETURN QUERY
    SELECT r.n, r.t, r.e, true, NULL::bigint, NULL::text
      FROM unnest(r_names, r_tokens, r_expiries) AS r(n, t, e);

    -- Usually every lease was renewed and this is skipped. Otherwise: every
    -- element not among those renewed, with its lease's current row.
    IF cardinality(r_names) < cardinality(names) THEN
        RETURN QUERY
        SELECT u.n, u.t, NULL::timestamptz, false, nullif(c.token, 0), c.holder
          FROM unnest(names, tokens) AS u(n, t)
          LEFT JOIN pglease.leases AS c ON c.name = u.n
         WHERE NOT EXISTS (SELECT 1 FROM unnest(r_names, r_tokens) AS r(n, t)
                            WHERE r.n = u.n AND r.t = u.t);
    END IF;
END
$$;

COMMENT ON FUNCTION pglease.renew_many(text[], bigint[], interval[]) IS
    'Renew many leases in one statement: element i is renew(names[i], tokens[i], '
    'ttls[i]). Returns a row per lease renewed (renewed = true, the new '
    'expires_at) and per element not renewed (renewed = false, the current '
    'token and holder).';

------------------------------------------------------------------------
-- release(name, token) and watch(name) / unwatch(name): end a lease at once,
-- and wake whoever waits for it.
------------------------------------------------------------------------

-- PostgreSQL serialises the commits of transactions that NOTIFY (they take
-- a database-wide lock held through their commit record's flush), so a
-- release that always notified could not share a WAL flush with any other
-- notifying commit. In this project's benchmark, an acquire+release cycle
-- of bare statements ran at 2,800/s at 8 clients with a notification and
-- 4,800/s without one. So release notifies only when somebody waits.
--
-- A waiter says that it waits: pglease.watch(name) takes a shared
-- session-level advisory lock on (1886156641, hashtext(name)) (key space
-- 0x706c7761, "plwa"), on the connection that LISTENs. release tries the
-- exclusive transaction-level lock on the same key after it has ended the
-- lease: if a watcher holds the shared lock, the try fails and release
-- notifies. If nobody watches, release holds the exclusive lock
-- until it commits, so a watch that comes in the meantime fails (it does
-- not block) and the waiter, told that a release is committing, tries
-- again; a watch that succeeds comes after the release committed, and the
-- waiter's next acquire sees the lease free. Either way no release is
-- missed. A hash collision between two names only costs a notification
-- nobody needed.
--
-- Each of those locks takes a slot of the shared lock table until commit,
-- and a transaction that released thousands of leases would run out of
-- them ("out of shared memory"). After 32 locks in one transaction
-- (counted in the transaction-local setting pglease.release_locks),
-- release notifies without asking.

-- The second half of the watch key of NAME (the first is 1886156641),
-- after checking NAME.
CREATE FUNCTION pglease._watch_key(name text)
RETURNS integer
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked text;
BEGIN
    IF NOT coalesce(octet_length(_watch_key.name) BETWEEN 1 AND pglease._max_text_bytes(), false) THEN
        checked := pglease._check_text('name', _watch_key.name);
    END IF;
    RETURN hashtext(_watch_key.name);
END
$$;

CREATE FUNCTION pglease.watch(name text)
RETURNS boolean
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT pg_try_advisory_lock_shared(1886156641, pglease._watch_key($1)) $$;

COMMENT ON FUNCTION pglease.watch(text) IS
    'Ask to be notified (channel pglease_release) when lease NAME is released: '
    'call it on the session that LISTENs, then try to acquire. Returns false, '
    'and watches nothing, while a release of NAME is committing: try to acquire '
    'again, then watch again. Lasts until unwatch(NAME) or the end of the session; '
    'calls nest (each watch needs its own unwatch).';

-- pg_advisory_unlock_shared warns when this session does not watch NAME;
-- the SET clause keeps that warning from the client (false says it).
CREATE FUNCTION pglease.unwatch(name text)
RETURNS boolean
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
SET client_min_messages = error
AS $$ SELECT pg_advisory_unlock_shared(1886156641, pglease._watch_key($1)) $$;

COMMENT ON FUNCTION pglease.unwatch(text) IS
    'Undo one watch(NAME) of this session. Returns false if this session did not watch NAME.';

CREATE FUNCTION pglease.release(name text, token bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked text;
    locks   integer;
BEGIN
    IF NOT coalesce(octet_length(release.name) BETWEEN 1 AND pglease._max_text_bytes()
                    AND release.token IS NOT NULL, false) THEN
        checked := pglease._check_text('name', release.name);
        PERFORM pglease._check_token(release.token);
    END IF;

    -- Keyed on the token: a delayed release from an earlier acquisition
    -- matches nothing; after expiry nothing changes.
    UPDATE pglease.leases AS l
       SET holder = NULL,
           expires_at = clock_timestamp(),
           released_at = clock_timestamp()
     WHERE l.name = release.name
       AND l.token = release.token
       AND l.holder IS NOT NULL
       AND clock_timestamp() < l.expires_at;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- Wakes watching waiters at commit (see the top of this file). Without
    -- watchers the exclusive lock is kept until commit, so that no watch
    -- can start in between; past 32 such locks, notify regardless.
    locks := coalesce(nullif(current_setting('pglease.release_locks', true), ''), '0')::integer;
    IF locks >= 32 THEN
        PERFORM pg_notify('pglease_release', release.name);
    ELSIF pg_try_advisory_xact_lock(1886156641, hashtext(release.name)) THEN
        checked := set_config('pglease.release_locks', (locks + 1)::text, true);
    ELSE
        PERFORM pg_notify('pglease_release', release.name);
    END IF;
    RETURN true;
END
$$;

COMMENT ON FUNCTION pglease.release(text, bigint) IS
    'End lease NAME held under TOKEN at once; if a session watches NAME '
    '(pglease.watch), notify channel pglease_release with the name. Returns true '
    'if this call ended it, false if it was not valid (stale token, already '
    'released, expired).';

------------------------------------------------------------------------
-- can_end_stale_transactions(): may acquire end a frozen holder's session?
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
