-- =====================================================================
-- 2. TAKING, KEEPING AND GIVING UP LEASES
--
-- acquire, renew, renew_many and release are each one statement from the
-- client, so their cost is the server's work inside the call: they test
-- all their arguments in one expression (the input helpers above run only
-- when it fails, for the exact message), read only the columns they decide
-- on, and raise synchronous_commit through _durable, which is inlined.
-- =====================================================================

-- LATER PARTS. Used here, defined in a later part (PL/pgSQL looks a
-- name up when a function runs, not when it is created): 3:
-- _end_declared; 4: _forgotten, _no_grant_now, _refuse_standby; 7:
-- _changed, _purge_history, _record; 11: _ahead, _line; 12:
-- _release_shared, _renew_shared, _shared, _writer_waits.

------------------------------------------------------------------------
-- acquire(name, holder, ttl): acquire if free or ended, within about 2 s.
------------------------------------------------------------------------

-- TAKEOVER FROM A FROZEN HOLDER. A fenced transaction holds FOR KEY SHARE
-- on its lease's row until it ends (see LOCKS at the top), and an
-- acquisition needs FOR UPDATE. Waiting for such a transaction would let a
-- holder frozen inside it (a stopped process, a paused VM, a silent
-- network) keep an expired lease from everyone. So a fenced transaction
-- also marks itself, visibly: assert_held takes a shared transaction-level
-- advisory lock on a 64-bit key, its MARKER, derived from the lease's
-- secret (leases.secret, readable by pglease only) and the transaction's
-- id (pglease._marker), held until the transaction ends (view
-- pglease.fenced). An acquirer recognises a fenced session by a marker
-- that matches one of that session's transaction ids. Nobody without the
-- secret can compute a marker, so no other role can take one first (to
-- keep a fenced transaction unmarked) or fake one (which would only get
-- its own session ended).
--
-- acquire, when it finds the row locked, takes FOR NO KEY UPDATE, which
-- conflicts with another acquirer, a renewal or a release (short) and never
-- with a fenced transaction; while it holds that lock nobody can renew,
-- release or acquire the lease, so its decision cannot go stale. If the
-- lease is still valid, it reports it held. If the lease has ended (expired
-- or released), every transaction still fenced on it declared a token that
-- is no longer valid: acquire lets them end by themselves for
-- FENCED_GRACE (_fenced_grace_ms, 50 ms: a check that passed as the lease
-- ended is usually committing then), ends the sessions of those still
-- open after it (pg_terminate_backend), so that they roll back and never
-- commit, and takes the lease as soon as their locks are gone.
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

-- The marker of a transaction with id X fenced on a lease with SECRET:
-- the first 64 bits of sha256(secret || X). Only immutable built-ins, so
-- that it is inlined where it is called (a SQL function that is not would
-- be planned again in every transaction).
CREATE FUNCTION pglease._marker(secret bytea, x xid)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT ('x' || pg_catalog.encode(pg_catalog.substr(
               pg_catalog.sha256($1 || $2::text::bytea), 1, 8),
               'hex'))::bit(64)::bigint
$$;

-- The sessions (but this one) in this database fenced on the lease with
-- SECRET: holding, as an advisory lock, the marker of one of their
-- transaction ids.
CREATE FUNCTION pglease._fenced_pids(secret bytea)
RETURNS SETOF integer
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT DISTINCT a.pid
      FROM pg_locks AS a
      JOIN pg_locks AS x ON x.pid = a.pid AND x.locktype = 'transactionid'
                        AND x.mode = 'ExclusiveLock' AND x.granted
     WHERE a.locktype = 'advisory' AND a.objsubid = 1 AND a.granted
       AND a.database = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())
       AND a.pid <> pg_backend_pid()
       AND ((a.classid::bigint << 32) | a.objid::bigint) = pglease._marker($1, x.transactionid)
$$;

-- Who holds the advisory lock (CLASSID, OBJID, OBJSUBID) in this
-- database, as pg_locks shows it (the 64-bit form: its high and low 32
-- bits, OBJSUBID 1; the two-part form: its two keys, OBJSUBID 2), for
-- messages: "session <pid> (role <name>, <mode>)", or "nobody".
CREATE FUNCTION pglease._key_holders(classid bigint, objid bigint, objsubid integer)
RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(string_agg(format('session %s (role %I, %s)', k.pid, a.usename,
                                      CASE WHEN k.granted THEN k.mode ELSE 'waiting' END),
                               ', ' ORDER BY k.pid), 'nobody')
      FROM pg_locks AS k
      LEFT JOIN pg_stat_activity AS a ON a.pid = k.pid
     WHERE k.locktype = 'advisory' AND k.objsubid = $3
       AND k.classid = ($1 & 4294967295)::oid AND k.objid = ($2 & 4294967295)::oid
       AND k.database = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())
       AND k.pid <> pg_backend_pid()
$$;

-- Ends every session (but this one) fenced on lease NAME, and records
-- the eviction in the history (with the term the sessions were fenced
-- under: the row's, since this runs before the fence moves). Returns
-- NULL, or, when the role that owns the functions may not end one of
-- them, why. Internal: it does not check that the lease has ended, so
-- nobody but the owner may call it.
CREATE FUNCTION pglease._end_fenced(name text)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lease pglease.leases;
    ended text;
    note  text;
BEGIN
    SELECT * INTO lease FROM pglease.leases AS l WHERE l.name = _end_fenced.name;
    -- One statement, so that the look-up and the signals are as close
    -- together as they can be. The sessions roll back and exit; their
    -- locks go with them.
    SELECT string_agg(f.pid::text, ', ' ORDER BY f.pid)
               FILTER (WHERE pg_terminate_backend(f.pid)) INTO ended
      FROM pglease._fenced_pids(lease.secret) AS f(pid);
    -- Recorded once: a takeover signals again, every few milliseconds,
    -- sessions that have not exited yet (on a loaded server one may take
    -- longer), and the term's latest history rows then already say so.
    IF ended IS NOT NULL
       AND NOT EXISTS (SELECT 1
                         FROM (SELECT h.token, h.event, h.detail FROM pglease._history AS h
                                WHERE h.name = lease.name ORDER BY h.id DESC LIMIT 8) AS r
                        WHERE r.token = lease.token AND r.event = 'evicted'
                          AND r.detail = 'ended sessions ' || ended) THEN
        PERFORM pglease._record(lease.name, lease.token, 'evicted', lease.holder,
                                clock_timestamp(), NULL, 'ended sessions ' || ended);
    END IF;
    RETURN NULL;
EXCEPTION WHEN insufficient_privilege THEN
    note := format('sessions %s are fenced on it under an earlier token, and role %I, which '
                   'owns the pglease functions, may not end them (%s); a superuser can allow '
                   'it: GRANT pg_signal_backend TO %I (sessions of superusers only a superuser '
                   'can end)',
                   (SELECT string_agg(f.pid::text, ', ' ORDER BY f.pid)
                      FROM pglease._fenced_pids(lease.secret) AS f(pid)),
                   current_user, SQLERRM, current_user);
    RETURN note;
END
$$;

REVOKE ALL ON FUNCTION pglease._end_fenced(text) FROM PUBLIC;

-- FENCED_GRACE: how long, in milliseconds, an acquirer that found an
-- ended lease's row locked lets the transactions fenced on it end by
-- themselves before it ends their sessions (see _fenced_ended). One
-- source of the figure, tested against pglease::limits::FENCED_GRACE.
CREATE FUNCTION pglease._fenced_grace_ms()
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 50 $$;

COMMENT ON FUNCTION pglease._fenced_grace_ms() IS
    'How long (ms) a takeover lets stale fenced transactions end by themselves before it ends their sessions.';

-- Whether the transactions holding ended lease NAME's row (fenced ones,
-- with FOR KEY SHARE) all end within FENCED_GRACE, leaving this
-- transaction, which holds FOR NO KEY UPDATE on the row already, with
-- FOR UPDATE on it. A fenced check that passed just before the lease
-- ended is usually committing at that moment (its commit waits for the
-- WAL flush): ending its session then would end it after its commit,
-- and its next, unrelated statement would fail with 57P01. Waiting in
-- the lock queue wakes as soon as they end. A transaction that waits for
-- this one (a frozen holder's renewal) times out here, or, where
-- deadlock_timeout is set below the grace, is found deadlocked with it:
-- either way the wait ends and they are ended. Called by _take_over only.
CREATE FUNCTION pglease._fenced_ended(name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- Restored as the caller had it when the function returns.
SET lock_timeout = 0
AS $$
BEGIN
    PERFORM pg_catalog.set_config('lock_timeout', pglease._fenced_grace_ms() || 'ms', true);
    PERFORM 1 FROM pglease.leases AS l WHERE l.name = _fenced_ended.name FOR UPDATE;
    RETURN FOUND;
EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
    RETURN false;
END
$$;

REVOKE ALL ON FUNCTION pglease._fenced_ended(text) FROM PUBLIC;

-- Called by acquire only, once FOR UPDATE SKIP LOCKED has found the row
-- locked by someone else. GONE_TOKEN, if not NULL, is a token whose
-- session-bound holder's session has ended: that term counts as ended.
-- NOTE is NULL when this transaction holds FOR UPDATE on the row and the
-- lease has ended; '' when the lease is held (valid), by HELD_BY until
-- HELD_UNTIL (bound to session HELD_SESSION, if any) as decided at
-- DECIDED_AT, which acquire reports as it is (the holder may release
-- before acquire could read the row again, and a lease reported free
-- but not acquired would look pinned); otherwise why it cannot be taken
-- within the grace. See the top of this file.
CREATE FUNCTION pglease._take_over(name text, gone_token bigint, OUT note text,
                                   OUT held_by text, OUT held_until timestamptz,
                                   OUT held_session integer, OUT decided_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- TAKEOVER_GRACE: how long each stage may wait for locks to go.
    give_up    timestamptz := clock_timestamp() + interval '1 second';
    ended_them boolean := false;
    cur_token  bigint;
    -- Shared holders hold it until then (see SHARED LEASES).
    readers    timestamptz;
BEGIN
    LOOP
        SELECT l.holder, l.expires_at, l.token, l.session_pid, l.readers_until
          INTO held_by, held_until, cur_token, held_session, readers
          FROM pglease.leases AS l WHERE l.name = _take_over.name FOR NO KEY UPDATE SKIP LOCKED;
        IF FOUND THEN
            -- Nobody can renew, release or acquire the lease now: decide.
            decided_at := clock_timestamp();
            IF (held_by IS NOT NULL AND decided_at < held_until
                AND cur_token IS DISTINCT FROM gone_token) OR readers > decided_at THEN
                note := '';
                RETURN;
            END IF;
            -- It has ended: the transactions still fenced on it are stale.
            -- They get FENCED_GRACE to end by themselves; those still open
            -- after it have their sessions ended.
            IF pglease._fenced_ended(_take_over.name) THEN
                note := NULL;
                RETURN;
            END IF;
            LOOP
                PERFORM 1 FROM pglease.leases AS l
                 WHERE l.name = _take_over.name FOR UPDATE SKIP LOCKED;
                IF FOUND THEN
                    note := NULL;
                    RETURN;
                END IF;
                note := pglease._end_fenced(_take_over.name);
                IF note IS NOT NULL THEN
                    RETURN;
                END IF;
                IF clock_timestamp() >= give_up THEN
                    note := 'its row is still locked after 1 s by a transaction that pglease '
                            'cannot end: one that locked the row without pglease.assert_held, '
                            'a prepared transaction, or a session that does not exit';
                    RETURN;
                END IF;
                PERFORM pg_sleep(0.002);
            END LOOP;
        END IF;
        -- An acquisition, renewal or release of the lease has not committed
        -- yet (usually a matter of milliseconds). Meanwhile, a lease that
        -- is valid on its committed row is simply held.
        SELECT l.holder, l.expires_at, l.token, l.session_pid, l.readers_until
          INTO held_by, held_until, cur_token, held_session, readers
          FROM pglease.leases AS l WHERE l.name = _take_over.name;
        decided_at := clock_timestamp();
        IF (held_by IS NOT NULL AND decided_at < held_until
            AND cur_token IS DISTINCT FROM gone_token) OR readers > decided_at THEN
            note := '';
            RETURN;
        END IF;
        IF clock_timestamp() >= give_up THEN
            IF ended_them THEN
                note := 'its row has been locked for over 1 s by an acquisition, renewal or '
                        'release of it that has not committed (a transaction left open: call '
                        'acquire, renew and release in transactions of their own)';
                RETURN;
            END IF;
            -- Ended on its committed row for the whole grace: a fenced
            -- transaction that renewed or released the lease itself and
            -- froze holds the row so. End the fenced ones; wait once more.
            note := pglease._end_fenced(_take_over.name);
            IF note IS NOT NULL THEN
                RETURN;
            END IF;
            ended_them := true;
            give_up := clock_timestamp() + interval '1 second';
        END IF;
        PERFORM pg_sleep(0.002);
    END LOOP;
END
$$;

REVOKE ALL ON FUNCTION pglease._take_over(text, bigint) FROM PUBLIC;

COMMENT ON FUNCTION pglease._take_over(text, bigint) IS
    'Internal to pglease.acquire: lock an ended lease FOR UPDATE, ending the sessions '
    'still fenced on it, within about 2 s; otherwise say why not.';

-- The first acquisition of NAME creates its row, with token 0, unless a
-- creator that committed meanwhile did. Creators of one name take turns,
-- on the row of pglease._creators for the name's hash (a row lock only
-- pglease can take, held to commit): two speculative inserts racing on
-- the primary key, followed by the winner's update (which inserts a new
-- primary-key entry when the page has no room), can otherwise deadlock.
-- The second creator then finds the committed row and inserts nothing.
-- Bounded like every wait here: after 1 s of another creation that has
-- not committed, returns why (NULL once the row exists).
CREATE FUNCTION pglease._create(name text)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    give_up timestamptz := clock_timestamp() + interval '1 second';
BEGIN
    LOOP
        PERFORM 1 FROM pglease._creators AS c
         WHERE c.slot = hashtext(_create.name) & 255 FOR UPDATE SKIP LOCKED;
        EXIT WHEN FOUND;
        IF clock_timestamp() >= give_up THEN
            RETURN 'another transaction creating a lease name has not committed for 1 s (call '
                   'acquire in a transaction of its own)';
        END IF;
        PERFORM pg_sleep(0.002);
    END LOOP;
    -- Marked if someone joined its line meanwhile (enqueue holds this
    -- slot until it commits; see LINES).
    INSERT INTO pglease.leases AS l (name, holder, token, expires_at, acquired_at, queued)
    -- expires_at: its creation, so that a refusal that reports the row
    -- answers a time (never -infinity, which clients cannot decode).
    VALUES (_create.name, NULL, 0, clock_timestamp(), clock_timestamp(),
            EXISTS (SELECT 1 FROM pglease._line AS q WHERE q.name = _create.name))
    ON CONFLICT ON CONSTRAINT leases_pkey DO NOTHING;
    RETURN NULL;
END
$$;

REVOKE ALL ON FUNCTION pglease._create(text) FROM PUBLIC;

-- THE PHASES OF AN ACQUISITION. acquire (below) decides in this order,
-- each step answering or passing on:
--   1. the fast path, read-only: a held lease is reported without a row
--      lock, a token, WAL or a commit flush (inline in acquire, which a
--      failed acquisition runs alone);
--   2. the common path (_take_released): a released lease of a name that
--      uses none of the uncommon features is taken by one statement;
--   3. the line check: nobody who waits in line is overtaken (see LINES);
--   4. the shared-holder check: refused while shared holders hold the
--      name (_writer_waits, see SHARED LEASES);
--   5. the take (_take), at once, and if that took nothing, after
--   6. the lock (_lock_ended): the long way, which creates the row,
--      refuses on a timeline not yet checked, and ends what pins an ended
--      lease (_take_over), then takes it with _take holding the row lock.
-- Every step that refuses answers an acquisition whose token is NULL; a
-- helper that answers nothing (NULL, whose checked_at is NULL) lets the
-- next step decide.

-- The handover branch of the fast path: the term was handed over to this
-- acquisition's place in line (see HANDOVER) and is its own. Bound to
-- this session if SESSION_BOUND (see SESSION-BOUND LEASES), else to the
-- session PID the row names, if any.
CREATE FUNCTION pglease._take_handed(name text, token bigint, expires_at timestamptz,
                                     holder text, checked_at timestamptz,
                                     session_bound boolean, pid integer)
RETURNS pglease.acquisition
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF _take_handed.session_bound THEN
        UPDATE pglease.leases AS l
           SET session_pid = pg_backend_pid(),
               session_start = (SELECT a.backend_start
                                  FROM pg_stat_get_activity(pg_backend_pid()) AS a)
         WHERE l.name = _take_handed.name AND l.token = _take_handed.token;
        PERFORM pg_try_advisory_lock(1886155618, pg_backend_pid());
        pid := pg_backend_pid();
    END IF;
    RETURN ROW(_take_handed.token, _take_handed.expires_at, _take_handed.holder,
               _take_handed.checked_at, 'handed over', _take_handed.pid, NULL, 0,
               NULL)::pglease.acquisition;
END
$$;

REVOKE ALL ON FUNCTION pglease._take_handed(text, bigint, timestamptz, text, timestamptz,
                                            boolean, integer) FROM PUBLIC;

-- The common path (step 2): NAME, released, whose name uses none of the
-- uncommon features, taken for HOLDER for SECONDS by one statement of its
-- own: _take's without the expired term to record. Serving it with
-- _take's statement too (its history rows inserted apart) ran the cycle
-- at 0.62 to 0.67 of the floor against 0.73 to 0.76 this way (pgbench, 8
-- clients, history off). It takes nothing (answers NULL) when the
-- row changed since it was read, is locked (a fenced transaction, another
-- acquirer), a name grant covers the name, or the timeline is not checked
-- or a grant delay runs (see TIMELINES, evaluated once per statement):
-- then the later steps decide. The token is drawn under the lock, by the
-- statement that checks the timeline. A guard added to _take belongs here
-- too.
CREATE FUNCTION pglease._take_released(name text, holder text, seconds numeric)
RETURNS pglease.acquisition
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    result     pglease.acquisition;
    t          timestamptz;
    new_id     bigint;
    history_on boolean;
BEGIN
    WITH s AS (
        SELECT l.name
          FROM pglease.leases AS l
         WHERE l.name = _take_released.name
           AND l.holder IS NULL AND NOT l.queued AND l.readers_until IS NULL
           AND EXISTS (SELECT 1 FROM pglease._checked AS c
                        WHERE c.grant_after IS NULL OR c.grant_after <= clock_timestamp())
           AND NOT EXISTS (SELECT 1 FROM pglease.name_grants AS g
                            WHERE starts_with(_take_released.name, g.prefix))
           FOR UPDATE OF l SKIP LOCKED
    ), u AS (
        UPDATE pglease.leases AS l
           SET holder = _take_released.holder,
               role = session_user,
               token = nextval('pglease.fence_seq'),
               expires_at = clock_timestamp()
                            + make_interval(secs => _take_released.seconds::double precision),
               acquired_at = clock_timestamp(),
               renewed_at = NULL,
               released_at = NULL,
               renewals = 0,
               session_pid = NULL,
               session_start = NULL,
               writer_waiting = NULL,
               writer_waits_until = NULL,
               handed_to = NULL
          FROM s
         WHERE l.name = s.name
           AND l.holder IS NULL AND NOT l.queued AND l.readers_until IS NULL
        RETURNING l.token, l.expires_at, l.acquired_at
    )
    SELECT u.token, u.expires_at, u.acquired_at, c.retention > interval '0'
      INTO result.token, result.expires_at, t, history_on
      FROM u CROSS JOIN pglease._history_config AS c;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF history_on THEN
        INSERT INTO pglease._history (name, token, event, holder, at, role)
        VALUES (_take_released.name, result.token, 'acquired', _take_released.holder, t,
                session_user)
        RETURNING _history.id INTO new_id;
        IF new_id % 128 = 0 THEN
            PERFORM pglease._purge_history(new_id);
        END IF;
    END IF;
    PERFORM pglease._durable();
    PERFORM pglease._changed(_take_released.name);
    result.holder := _take_released.holder;
    result.checked_at := t;
    RETURN result;
END
$$;

REVOKE ALL ON FUNCTION pglease._take_released(text, text, numeric) FROM PUBLIC;

-- The take: one statement, FOR UPDATE SKIP LOCKED in s, which the update
-- joins. A row that someone else locks (a fenced transaction, another
-- acquirer) is not updated, and unless NAME_OK (the caller checked the
-- name's grants) neither is one that a name grant covers. The lease is
-- decided on the latest row version with a clock read as the update runs,
-- after the lock (a version committed after this statement began makes
-- PostgreSQL evaluate the WHERE clause again on it); the term of
-- GONE_TOKEN, whose holder's session has ended, counts as ended. The
-- token is drawn only for the row updated, under the lock: for each name,
-- tokens strictly increase in commit order. The history rows are
-- inserted by the same statement. SESSION_BOUND binds the lease to this
-- session (see SESSION-BOUND LEASES); TICKET, a place in line, leaves the
-- line.
-- Answers the acquisition, or NULL if it took nothing.
CREATE FUNCTION pglease._take(name text, holder text, seconds numeric, gone_token bigint,
                              name_ok boolean, session_bound boolean, ticket bigint)
RETURNS pglease.acquisition
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    result     pglease.acquisition;
    t          timestamptz;
    new_id     bigint;
    -- The token of the term this acquisition took over, when that term
    -- ended without a release, and the role that held it.
    ended_term bigint;
    ended_role name;
    my_pid     integer;
    my_start   timestamptz;
BEGIN
    IF _take.session_bound THEN
        my_pid := pg_backend_pid();
        SELECT a.backend_start INTO my_start FROM pg_stat_get_activity(my_pid) AS a;
    END IF;
    WITH s AS (
        SELECT l.name, l.holder, l.token, l.expires_at, l.renewals, l.role
          FROM pglease.leases AS l
         WHERE l.name = _take.name
           -- Checked on this timeline, and not within a grant delay
           -- (evaluated once per statement: see TIMELINES).
           AND EXISTS (SELECT 1 FROM pglease._checked AS c
                        WHERE c.grant_after IS NULL OR c.grant_after <= clock_timestamp())
           FOR UPDATE OF l SKIP LOCKED
    ), u AS (
        UPDATE pglease.leases AS l
           SET holder = _take.holder,
               role = session_user,
               token = nextval('pglease.fence_seq'),
               expires_at = clock_timestamp() + make_interval(secs => _take.seconds::double precision),
               acquired_at = clock_timestamp(),
               renewed_at = NULL,
               released_at = NULL,
               renewals = 0,
               session_pid = my_pid,
               session_start = my_start,
               writer_waiting = NULL,
               writer_waits_until = NULL,
               handed_to = NULL
          FROM s
         WHERE l.name = s.name
           AND (l.holder IS NULL OR clock_timestamp() >= l.expires_at
                OR l.token = _take.gone_token)
           AND (l.readers_until IS NULL OR clock_timestamp() >= l.readers_until)
           AND (_take.name_ok OR NOT EXISTS (SELECT 1 FROM pglease.name_grants AS g
                                              WHERE starts_with(_take.name, g.prefix)))
        RETURNING l.token, l.expires_at, l.acquired_at, s.holder AS old_holder,
                  s.token AS old_token, s.expires_at AS old_expiry, s.renewals AS old_renewals,
                  s.role AS old_role
    ), h AS (
        -- The term before ended without a release: it expired (recorded
        -- at the time it did), or its holder's session ended (recorded
        -- now). Then this term.
        INSERT INTO pglease._history (name, token, event, holder, at, renewals, detail, role)
        SELECT _take.name, e.token, e.event, e.holder, e.at, e.renewals, e.detail, session_user
          FROM u
         CROSS JOIN pglease._history_config AS c
         CROSS JOIN LATERAL (VALUES (u.old_token, 'expired', u.old_holder,
                                     least(u.old_expiry, u.acquired_at), u.old_renewals,
                                     CASE WHEN u.old_expiry > u.acquired_at
                                          THEN 'its holder''s session ended' END,
                                     u.old_holder IS NOT NULL AND u.old_token > 0),
                                    (u.token, 'acquired', _take.holder, u.acquired_at,
                                     NULL, NULL, true))
                            AS e(token, event, holder, at, renewals, detail, wanted)
         WHERE c.retention > interval '0' AND e.wanted
        RETURNING _history.id
    )
    SELECT u.token, u.expires_at, u.acquired_at, (SELECT max(h.id) FROM h),
           CASE WHEN u.old_holder IS NOT NULL AND u.old_token > 0 THEN u.old_token END,
           u.old_role
      INTO result.token, result.expires_at, t, new_id, ended_term, ended_role
      FROM u;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    -- The term before ended without a release: the sessions declared
    -- under it are stale (see DECLARED SESSIONS).
    IF ended_term IS NOT NULL THEN
        PERFORM pglease._end_declared(_take.name, ended_term, ended_role);
    END IF;
    PERFORM pglease._durable();
    IF new_id % 128 = 0 THEN
        PERFORM pglease._purge_history(new_id);
    END IF;
    IF _take.ticket IS NOT NULL THEN
        -- Out of the line: its place is taken.
        DELETE FROM pglease._line AS q WHERE q.name = _take.name AND q.ticket = _take.ticket;
        result.ahead := 0;
    END IF;
    IF _take.session_bound THEN
        -- The wake-up for waiters (see SESSION-BOUND LEASES), held until
        -- the session ends; taken again by each session-bound acquisition
        -- (a counter, one lock).
        PERFORM pg_try_advisory_lock(1886155618, my_pid);
    END IF;
    PERFORM pglease._changed(_take.name);
    result.holder := _take.holder;
    result.checked_at := t;
    result.holder_session := my_pid;
    RETURN result;
END
$$;

REVOKE ALL ON FUNCTION pglease._take(text, text, numeric, bigint, boolean, boolean, bigint)
    FROM PUBLIC;

-- The lock, the long way to a lease the first take could not take: no
-- token before this server's timeline has been checked, and none during
-- the grant delay after a change (see TIMELINES); the name's grants (see
-- AUTHORITY), checked before anything is written; the row created if
-- FOUND_ROW is false; then the row locked FOR UPDATE, at once if nobody
-- else locks it, else by _take_over, which ends the sessions fenced on an
-- ended lease (GONE_TOKEN: a term whose holder's session ended). Answers
-- NULL when this transaction holds the row lock and the lease has ended:
-- the caller takes it. Otherwise the refusal, held as decided on the
-- latest row version, by shared holders, or why not (the fast path's
-- CUR_EXPIRY, CUR_HOLDER and CUR_PID describe the lease when nothing newer
-- was read). FAIR and WAITS as acquire has them.
CREATE FUNCTION pglease._lock_ended(name text, holder text, waits boolean, fair boolean,
                                    gone_token bigint, found_row boolean,
                                    cur_expiry timestamptz, cur_holder text, cur_pid integer)
RETURNS pglease.acquisition
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    note      text;
    delayed   timestamptz;
    t         timestamptz;
    cur_token bigint;
    readers   timestamptz;
    result    pglease.acquisition;
BEGIN
    SELECT g.why, g.delayed_until INTO note, delayed FROM pglease._no_grant_now('acquire') AS g;
    t := clock_timestamp();
    IF note IS NOT NULL THEN
        RETURN ROW(NULL, coalesce(cur_expiry, t), cur_holder, t, note, cur_pid, delayed,
                   NULL, _lock_ended.fair)::pglease.acquisition;
    END IF;
    IF NOT pglease._may_use_name(_lock_ended.name) THEN
        PERFORM pglease._refuse_name(_lock_ended.name, 'acquire');
    END IF;
    IF NOT _lock_ended.found_row THEN
        note := pglease._create(_lock_ended.name);
        IF note IS NOT NULL THEN
            t := clock_timestamp();
            RETURN ROW(NULL, t, NULL, t, note, NULL, NULL, NULL,
                       _lock_ended.fair)::pglease.acquisition;
        END IF;
    END IF;

    -- Usually nobody else locks the row: take FOR UPDATE at once.
    SELECT l.holder, l.expires_at, l.token, l.session_pid, l.readers_until
      INTO cur_holder, cur_expiry, cur_token, cur_pid, readers
      FROM pglease.leases AS l WHERE l.name = _lock_ended.name FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        SELECT o.note, o.held_by, o.held_until, o.held_session, o.decided_at
          INTO note, cur_holder, cur_expiry, cur_pid, t
          FROM pglease._take_over(_lock_ended.name, _lock_ended.gone_token) AS o;
        SELECT l.readers_until INTO readers FROM pglease.leases AS l WHERE l.name = _lock_ended.name;
        IF readers > clock_timestamp() THEN
            result := pglease._writer_waits(_lock_ended.name, _lock_ended.holder, NULL,
                                            _lock_ended.waits, _lock_ended.fair);
            IF result.checked_at IS NOT NULL THEN
                RETURN result;
            END IF;
        END IF;
        IF note = '' THEN
            -- Held, as decided (see _take_over).
            RETURN ROW(NULL, cur_expiry, cur_holder, t, NULL, cur_pid, NULL, NULL,
                       _lock_ended.fair)::pglease.acquisition;
        END IF;
        -- The committed row: locked by this transaction if taken;
        -- otherwise the lease has ended (expires_at <= checked_at, or
        -- holder NULL), a transaction that could not be ended pins it, and
        -- note says why.
        SELECT l.holder, l.expires_at, l.token, l.session_pid
          INTO cur_holder, cur_expiry, cur_token, cur_pid
          FROM pglease.leases AS l WHERE l.name = _lock_ended.name;
        IF note IS NOT NULL THEN
            -- For the server's log (the caller gets it in the answer).
            RAISE WARNING USING MESSAGE = format('pglease: lease %L has ended, but %s',
                                                 _lock_ended.name, note);
            RETURN ROW(NULL, cur_expiry, cur_holder, clock_timestamp(), note, cur_pid, NULL, NULL,
                       _lock_ended.fair)::pglease.acquisition;
        END IF;
    END IF;
    -- Decide on the latest row version and a clock read after the lock.
    t := clock_timestamp();
    IF cur_holder IS NOT NULL AND t < cur_expiry
       AND cur_token IS DISTINCT FROM _lock_ended.gone_token THEN
        RETURN ROW(NULL, cur_expiry, cur_holder, t, NULL, cur_pid, NULL, NULL,
                   _lock_ended.fair)::pglease.acquisition;
    END IF;
    IF readers > t THEN
        -- NULL if the last shared holder has just ended: take it.
        RETURN pglease._writer_waits(_lock_ended.name, _lock_ended.holder, NULL,
                                     _lock_ended.waits, _lock_ended.fair);
    END IF;
    RETURN NULL;
END
$$;

REVOKE ALL ON FUNCTION pglease._lock_ended(text, text, boolean, boolean, bigint, boolean,
                                           timestamptz, text, integer) FROM PUBLIC;

CREATE FUNCTION pglease.acquire(name text, holder text, ttl interval,
                                session_bound boolean DEFAULT false,
                                ticket bigint DEFAULT NULL,
                                waits boolean DEFAULT false)
RETURNS pglease.acquisition
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    seconds    numeric := extract(epoch FROM acquire.ttl);
    checked    text;
    found_row  boolean;      -- the row as the fast path read it: ...
    cur_holder text;
    cur_expiry timestamptz;
    cur_token  bigint;
    cur_pid    integer;
    cur_start  timestamptz;
    cur_role   name;
    line_set   boolean;      -- someone may wait in line (see LINES)
    readers    timestamptz;  -- until when shared holders hold it (SHARED LEASES)
    handed     bigint;       -- the place the term was handed over to (HANDOVER)
    name_fair  boolean;      -- every waiter for the name waits in line
    -- The token of a valid term whose holder's session has ended (see
    -- SESSION-BOUND LEASES): that term counts as ended.
    gone_token bigint;
    ahead      integer;      -- acquirers in line before this one
    t          timestamptz;
    result     pglease.acquisition;
BEGIN
    IF NOT coalesce(octet_length(acquire.name) BETWEEN 1 AND pglease._max_text_bytes()
                    AND octet_length(acquire.holder) BETWEEN 1 AND pglease._max_text_bytes()
                    AND seconds > 0 AND seconds <= pglease._max_ttl_seconds()
                    AND acquire.session_bound IS NOT NULL, false) THEN
        checked := pglease._check_text('name', acquire.name);
        checked := pglease._check_text('holder', acquire.holder);
        PERFORM pglease._check_ttl(acquire.ttl);
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'session_bound',
            MESSAGE = 'pglease: session_bound must be true or false, got NULL';
    END IF;

    -- 1. The fast path, read-only: a held, unexpired lease is reported
    -- without a row lock, a token, WAL or a commit flush, also while fenced
    -- transactions hold it, or while its holder's session lives if it is
    -- session-bound. Read twice at most (see the handover below).
    FOR look IN 1 .. 2 LOOP
        SELECT l.holder, l.expires_at, l.token, l.session_pid, l.session_start, l.queued,
               l.readers_until, l.handed_to, l.role, l.fair
          INTO cur_holder, cur_expiry, cur_token, cur_pid, cur_start, line_set, readers,
               handed, cur_role, name_fair
          FROM pglease.leases AS l WHERE l.name = acquire.name;
        found_row := FOUND;
        t := clock_timestamp();
        EXIT WHEN cur_holder IS NULL OR t >= cur_expiry;
        IF handed = acquire.ticket AND cur_holder = acquire.holder
           AND (cur_role = session_user OR pglease._may_act(cur_role))
           AND NOT pg_is_in_recovery() THEN
            RETURN pglease._take_handed(acquire.name, cur_token, cur_expiry, cur_holder, t,
                                        acquire.session_bound, cur_pid);
        END IF;
        IF cur_pid IS NULL OR NOT pglease._session_gone(cur_pid, cur_start) THEN
            -- A waiter in line keeps its place with every attempt.
            IF acquire.ticket IS NOT NULL AND NOT pg_is_in_recovery() THEN
                ahead := pglease._ahead(acquire.name, acquire.ticket, acquire.ttl);
                -- -1: a handover to this place committed after the row was
                -- read, ending the place: the row, read again, is this
                -- acquisition's term.
                CONTINUE WHEN ahead < 0 AND look = 1;
                ahead := greatest(ahead, 0);
            END IF;
            RETURN ROW(NULL, cur_expiry, cur_holder, t, NULL, cur_pid, NULL, ahead,
                       name_fair)::pglease.acquisition;
        END IF;
        gone_token := cur_token;
        EXIT;
    END LOOP;
    -- A standby takes nothing (and cannot read pglease._checked).
    IF pg_is_in_recovery() THEN
        PERFORM pglease._refuse_standby('acquire a lease');
    END IF;

    -- 2. The common path: a released lease whose name uses none of the
    -- uncommon features (nobody has waited in line, no shared holder, no
    -- name grant, no session binding, no place in line), decided from the
    -- row just read, is taken by one statement (_take_released).
    IF cur_holder IS NULL AND found_row AND NOT line_set AND readers IS NULL
       AND NOT acquire.session_bound AND acquire.ticket IS NULL THEN
        result := pglease._take_released(acquire.name, acquire.holder, seconds);
        IF result.checked_at IS NOT NULL THEN
            RETURN result;
        END IF;
    END IF;

    -- 3. The line, read only when someone has joined it since it was last
    -- found empty, when this acquisition has a place in it, or for a name
    -- never acquired (its line has no row to mark): nobody who waits in
    -- line is overtaken by a later acquirer.
    IF line_set OR acquire.ticket IS NOT NULL OR NOT found_row THEN
        ahead := greatest(pglease._ahead(acquire.name, acquire.ticket, acquire.ttl), 0);
        IF ahead > 0 THEN
            t := clock_timestamp();
            RETURN ROW(NULL, coalesce(cur_expiry, t), cur_holder, t,
                       format('first come, first served: %s acquirer(s) wait in line before '
                              'this one', ahead),
                       cur_pid, NULL, ahead, name_fair)::pglease.acquisition;
        END IF;
    END IF;

    -- 4. Held shared: refused, new shared holders wait behind this one
    -- (a write: names granted to other roles refuse first).
    IF readers > t THEN
        IF NOT pglease._may_use_name(acquire.name) THEN
            PERFORM pglease._refuse_name(acquire.name, 'acquire');
        END IF;
        result := pglease._writer_waits(acquire.name, acquire.holder, ahead, acquire.waits,
                                        name_fair);
        IF result.checked_at IS NOT NULL THEN
            RETURN result;
        END IF;
    END IF;

    -- 5. The take, at once if the row exists, nobody locks it and no name
    -- grant covers the name, ...
    IF found_row THEN
        result := pglease._take(acquire.name, acquire.holder, seconds, gone_token, false,
                                acquire.session_bound, acquire.ticket);
        IF result.checked_at IS NOT NULL THEN
            RETURN result;
        END IF;
    END IF;
    -- 6. ... else after the lock, which answers unless this transaction
    -- then holds the row of an ended lease: the take cannot miss it.
    result := pglease._lock_ended(acquire.name, acquire.holder, acquire.waits, name_fair,
                                  gone_token, found_row, cur_expiry, cur_holder, cur_pid);
    IF result.checked_at IS NOT NULL THEN
        RETURN result;
    END IF;
    result := pglease._take(acquire.name, acquire.holder, seconds, gone_token, true,
                            acquire.session_bound, acquire.ticket);
    IF result.checked_at IS NOT NULL THEN
        RETURN result;
    END IF;
    -- Not reached. Report the row as it is.
    RETURN (SELECT ROW(NULL, l.expires_at, l.holder, clock_timestamp(), NULL, l.session_pid,
                       NULL, NULL, name_fair)::pglease.acquisition
              FROM pglease.leases AS l WHERE l.name = acquire.name);
END
$$;

COMMENT ON FUNCTION pglease.acquire(text, text, interval, boolean, bigint, boolean) IS
    'Acquire lease NAME for HOLDER for TTL if it is free or ended and nobody waits in line '
    'for it before this acquisition, ending the '
    'sessions of transactions still fenced on an ended lease. Answers within about 2 s. '
    'SESSION_BOUND (default false): the lease also ends when this server session ends '
    '(an acquirer takes it at once). TICKET (default none): the place in line that '
    'enqueue gave, kept for another TTL by this attempt (LE003 if it is no longer in '
    'line). WAITS (default false): the caller will attempt again until it acquires; '
    'refused because of shared holders, it keeps new shared holders out meanwhile '
    '(writer preference; without WAITS, only a second refusal within 5 s does). Returns (token, expires_at, holder, checked_at, note, '
    'holder_session, delayed_until, ahead); token is NULL when not acquired, and then '
    'expires_at and holder '
    'describe the current holder (expires_at <= checked_at: the lease has ended but a '
    'transaction that could not be ended still holds it, and note says why), '
    'holder_session is the process id of the session the lease is bound to, if any, and '
    'ahead how many acquirers wait in line before this one.';

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
           renewed_at = clock_timestamp(),
           renewals = l.renewals + 1
     WHERE l.name = renew.name
       AND l.token = renew.token
       AND l.holder IS NOT NULL
       AND clock_timestamp() < l.expires_at
       AND (l.role = session_user OR pglease._may_act(l.role))
       AND (l.session_pid IS NULL OR NOT pglease._session_gone(l.session_pid, l.session_start))
    RETURNING l.expires_at INTO new_expiry;
    IF new_expiry IS NULL THEN
        -- Not the exclusive holder's token: a shared holder's (see SHARED
        -- LEASES), or a lease lost.
        new_expiry := pglease._renew_shared(renew.name, renew.token, renew.ttl);
        IF new_expiry IS NULL THEN
            PERFORM pglease._refuse_foreign(renew.name, renew.token, 'renew');
        END IF;
    END IF;
    IF new_expiry IS NOT NULL THEN
        -- The validity acknowledged must survive a crash (see DURABILITY).
        PERFORM pglease._durable();
    END IF;
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
-- a release or an expiry, session_ended true for a session-bound lease
-- whose session has ended (see SESSION-BOUND LEASES), and forgotten_in the
-- timeline whose change lost the acquisition (see TIMELINES). A name may appear
-- more than once: only elements with the current token are renewed, and
-- equal elements renew the lease once (and yield one row).
CREATE FUNCTION pglease.renew_many(names text[], tokens bigint[], ttls interval[])
RETURNS TABLE (name text, token bigint, expires_at timestamptz, renewed boolean,
               current_token bigint, current_holder text, session_ended boolean,
               forgotten_in bigint)
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
    shared     record;
    renewed    timestamptz;
BEGIN
    IF names IS NULL OR tokens IS NULL OR ttls IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'names',
            MESSAGE = 'pglease: names, tokens and ttls must not be NULL';
    END IF;
    IF greatest(array_ndims(names), array_ndims(tokens), array_ndims(ttls)) > 1 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'names',
            MESSAGE = 'pglease: names, tokens and ttls must be lists (arrays of one dimension)';
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
               renewed_at = clock_timestamp(),
               renewals = l.renewals + 1
          FROM unnest(names, tokens, ttls) AS u(n, t, ttl)
         WHERE l.name = u.n
           AND l.token = u.t
           AND l.holder IS NOT NULL
           AND clock_timestamp() < l.expires_at
           AND (l.role = session_user OR pglease._may_act(l.role))
           AND (l.session_pid IS NULL OR NOT pglease._session_gone(l.session_pid, l.session_start))
        RETURNING l.name, l.token, l.expires_at
    )
    SELECT coalesce(array_agg(upd.name), '{}'), coalesce(array_agg(upd.token), '{}'),
           coalesce(array_agg(upd.expires_at), '{}')
      INTO r_names, r_tokens, r_expiries
      FROM upd;
    -- Shared holders' tokens (see SHARED LEASES), one by one in byte
    -- order of their names (each locks its name's row).
    IF cardinality(r_names) < cardinality(names) THEN
        FOR shared IN
            SELECT d.n, d.t, d.ttl
              FROM (SELECT DISTINCT u.n, u.t, u.ttl
                      FROM unnest(names, tokens, ttls) AS u(n, t, ttl)
                      JOIN pglease._shared AS s ON s.token = u.t AND s.name = u.n) AS d
             ORDER BY d.n COLLATE "C", d.t
        LOOP
            renewed := pglease._renew_shared(shared.n, shared.t, shared.ttl);
            IF renewed IS NOT NULL THEN
                r_names := r_names || shared.n;
                r_tokens := r_tokens || shared.t;
                r_expiries := r_expiries || renewed;
            END IF;
        END LOOP;
    END IF;
    IF cardinality(r_names) > 0 THEN
        -- The validity acknowledged must survive a crash (see DURABILITY).
        PERFORM pglease._durable();
    END IF;
    RETURN QUERY
    SELECT r.n, r.t, r.e, true, NULL::bigint, NULL::text, false, NULL::bigint
      FROM unnest(r_names, r_tokens, r_expiries) AS r(n, t, e);

    -- Usually every lease was renewed and this is skipped. Otherwise: every
    -- element not among those renewed, with its lease's current row.
    IF cardinality(r_names) < cardinality(names) THEN
        -- A valid lease this session may not act under is refused as a
        -- whole statement (nothing renewed), never reported as lost.
        SELECT u.n, c.role INTO bad
          FROM unnest(names, tokens) AS u(n, t)
          JOIN pglease.leases AS c ON c.name = u.n AND c.token = u.t
         WHERE c.holder IS NOT NULL AND clock_timestamp() < c.expires_at
           AND NOT pglease._may_act(c.role)
         LIMIT 1;
        IF FOUND THEN
            PERFORM pglease._refuse_owner(bad.n, bad.role, 'renew');
        END IF;
        RETURN QUERY
        SELECT u.n, u.t, NULL::timestamptz, false, nullif(c.token, 0), c.holder::text,
               coalesce(c.token = u.t AND c.holder IS NOT NULL AND clock_timestamp() < c.expires_at
                        AND c.session_pid IS NOT NULL
                        AND pglease._session_gone(c.session_pid, c.session_start), false),
               (pglease._forgotten(u.t, c.token)).timeline
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
    'token and holder, whether a session-bound holder''s session has ended, and the '
    'timeline whose change lost the acquisition, if one did).';

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
    checked    text;
    locks      integer;
    new_id     bigint;
    history_on boolean;
    old_holder text;
    ended_at   timestamptz;
    old_renewals integer;
BEGIN
    IF NOT coalesce(octet_length(release.name) BETWEEN 1 AND pglease._max_text_bytes()
                    AND release.token IS NOT NULL, false) THEN
        checked := pglease._check_text('name', release.name);
        PERFORM pglease._check_token(release.token);
    END IF;

    -- Keyed on the token: a delayed release from an earlier acquisition
    -- matches nothing; after expiry nothing changes. The holder, for the
    -- history only, from the row as this statement's snapshot shows it (a
    -- token's holder never changes but to NULL, which this update then
    -- does not match).
    UPDATE pglease.leases AS l
       SET holder = NULL,
           expires_at = clock_timestamp(),
           released_at = clock_timestamp()
      FROM pglease._history_config AS c
     WHERE l.name = release.name
       AND l.token = release.token
       AND l.holder IS NOT NULL
       AND clock_timestamp() < l.expires_at
       AND (l.role = session_user OR pglease._may_act(l.role))
    RETURNING c.retention > interval '0', l.released_at, l.renewals,
              CASE WHEN c.retention > interval '0'
                   THEN (SELECT o.holder FROM pglease.leases AS o
                          WHERE o.name = release.name AND o.token = release.token) END
         INTO history_on, ended_at, old_renewals, old_holder;
    -- Not the exclusive holder's token: a shared holder's (see SHARED
    -- LEASES), or a lease not valid.
    IF NOT FOUND AND NOT pglease._release_shared(release.name, release.token) THEN
        PERFORM pglease._refuse_foreign(release.name, release.token, 'release');
        RETURN false;
    END IF;
    -- Wakes watching waiters at commit (see the top of this file). Without
    -- watchers the exclusive lock is kept until commit, so that no watch
    -- can start in between; past 32 such locks, notify regardless.
    -- The payload is the watch key (hashtext of the name): a hint that
    -- names no lease and is believed by nobody (see NOTIFICATIONS).
    locks := coalesce(nullif(current_setting('pglease.release_locks', true), ''), '0')::integer;
    IF locks >= 32 OR locks < 0 THEN
        PERFORM pg_notify('pglease_release', hashtext(release.name)::text);
    ELSIF pg_try_advisory_xact_lock(1886156641, hashtext(release.name)) THEN
        checked := set_config('pglease.release_locks', (locks + 1)::text, true);
    ELSE
        PERFORM pg_notify('pglease_release', hashtext(release.name)::text);
    END IF;
    IF history_on THEN
        INSERT INTO pglease._history (name, token, event, holder, at, renewals, role)
        VALUES (release.name, release.token, 'released', old_holder, ended_at, old_renewals,
                session_user)
        RETURNING _history.id INTO new_id;
        IF new_id % 128 = 0 THEN
            PERFORM pglease._purge_history(new_id);
        END IF;
    END IF;
    PERFORM pglease._changed(release.name);
    RETURN true;
END
$$;

COMMENT ON FUNCTION pglease.release(text, bigint) IS
    'End lease NAME held under TOKEN at once; if a session watches NAME '
    '(pglease.watch), notify channel pglease_release with hashtext(NAME). Returns true '
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
