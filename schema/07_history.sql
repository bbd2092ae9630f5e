-- =====================================================================
-- 7. THE HISTORY, AND A BREAK-GLASS RELEASE THAT FENCES
--
-- HISTORY. Every transition of a lease is recorded in pglease.history
-- (the table pglease._history), with its token, holder, database time and
-- detail: acquired; released; expired (recorded when the lease is next
-- acquired, at the time it expired: the database has no event for an
-- expiry); evicted (that acquisition, or a force release, ended sessions
-- still inside fenced transactions under the old token; detail: their
-- process ids); force_released (with the administrator's reason); value
-- (the value published); step_down_requested (by whom). Renewals are not
-- transitions: each term's count is kept on the lease (renewals, shown in
-- the status view) and recorded with the term's end.
--
-- The rows are written by the functions that make the transitions,
-- through pglease._record; renew only counts.
--
-- ROLES. Each row names the login role whose call recorded it (role).
--
-- RETENTION AND BOUNDS. Rows older than the retention (default 30 days;
-- '0' records nothing), and the oldest beyond max_rows (default
-- 1,000,000), are deleted by the transitions themselves, no daemon: one
-- in 128 looks at the 1,000 oldest rows and deletes those. Both are set
-- by an administrator (pglease.set_history), in a table: no session can
-- turn the history off or purge it by a setting of its own. What one
-- term can add is bounded: acquired, released or expired, evicted or
-- force_released, one step-down request, and the first 16 values (each
-- its first 1,000 characters); so the history holds at most about
-- max_rows rows of at most about 1 KB of detail each.
--
-- COST. Recording is two inserts per acquire+release cycle (docs/
-- benchmark.md has the figures). A lease that changes hands thousands of
-- times a second can do without: set the retention to '0' (the renewal
-- count stays).
--
-- FORCE RELEASE. pglease.force_release(name, reason) ends a held lease at
-- once and moves its fence: the lease gets a new token that nobody holds,
-- so the old holder's token is stale from that instant (its renewal
-- fails, its fenced writes are rejected, its release is ignored), and the
-- old holder's open fenced transactions are ended like a takeover's
-- (their sessions, which need pg_signal_backend for the owner, see
-- acquire). It is not granted to PUBLIC: GRANT EXECUTE to an
-- administrator role.
-- =====================================================================

-- LATER PARTS. Used here, defined in a later part (PL/pgSQL looks a
-- name up when a function runs, not when it is created): 8: _counted;
-- 12: _lock_for_shared, _shared.

CREATE VIEW pglease.history AS
SELECT h.id, h.name, h.token, h.event, h.holder, h.at, h.renewals, h.detail, h.role
  FROM pglease._history AS h;

COMMENT ON VIEW pglease.history IS
    'Every transition of every lease, oldest first by id: acquired, released, expired '
    '(recorded at the next acquisition, at the time it expired), evicted (sessions still '
    'fenced under the old token were ended; detail: their process ids), force_released '
    '(detail: the reason), value (detail: the value), step_down_requested (detail: by whom); '
    'renewals is the term''s renewal count on the row that ends it; role is the login '
    'role whose call recorded it. Kept as pglease.history_settings says (default 30 '
    'days, 1000000 rows).';

CREATE FUNCTION pglease.set_history(retention interval, max_rows bigint DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT pglease.is_admin() THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('pglease: role %I may not change the history''s settings: '
                             'pglease administrators only', session_user);
    END IF;
    IF set_history.retention IS NULL OR set_history.retention < interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'retention',
            MESSAGE = format('pglease: retention must be an interval of zero or more, got %s',
                             coalesce(set_history.retention::text, 'NULL'));
    END IF;
    IF set_history.max_rows IS NOT NULL AND set_history.max_rows < 1000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'max_rows',
            MESSAGE = format('pglease: max_rows must be at least 1000, got %s',
                             set_history.max_rows);
    END IF;
    UPDATE pglease._history_config AS c
       SET retention = set_history.retention,
           max_rows = coalesce(set_history.max_rows, c.max_rows);
END
$$;

COMMENT ON FUNCTION pglease.set_history(interval, bigint) IS
    'Administrators only: keep history rows for RETENTION (''0'' records nothing; default '
    '30 days) and at most about MAX_ROWS of them (default 1000000; NULL keeps it).';

CREATE VIEW pglease.history_settings AS
SELECT c.retention, c.max_rows FROM pglease._history_config AS c;

COMMENT ON VIEW pglease.history_settings IS
    'The history''s retention and row bound (set by pglease.set_history).';

-- Records one transition in the history, unless the retention is '0';
-- now and then (one row id in 128) deletes rows past the retention or
-- the row bound. Called by every function that makes a transition, in
-- its own transaction. Like the input helpers it uses only built-in
-- functions (pg_catalog is always searched first) and carries no SET
-- clause (its callers' search_path is pglease's own), whose save and
-- restore of search_path on every call would be most of its cost.
CREATE FUNCTION pglease._record(name text, token bigint, event text, holder text,
                                at timestamptz, renewals integer, detail text)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    new_id bigint;
BEGIN
    -- One statement: the settings' row decides whether anything is
    -- inserted.
    INSERT INTO pglease._history (name, token, event, holder, at, renewals, detail, role)
    SELECT _record.name, _record.token, _record.event, _record.holder, _record.at,
           _record.renewals, _record.detail, session_user
      FROM pglease._history_config AS c
     WHERE c.retention > interval '0'
    RETURNING _history.id INTO new_id;
    IF new_id % 128 = 0 THEN
        PERFORM pglease._purge_history(new_id);
    END IF;
END
$$;

REVOKE ALL ON FUNCTION pglease._record(text, bigint, text, text, timestamptz, integer, text)
    FROM PUBLIC;

-- Deletes, among the 1,000 oldest history rows (by id, through the
-- primary key: no index on time to keep), those past the retention or
-- beyond the row bound, given the id of the row just inserted. Called
-- for one row id in 128.
CREATE FUNCTION pglease._purge_history(new_id bigint)
RETURNS void
LANGUAGE sql VOLATILE
AS $$
    DELETE FROM pglease._history AS h
     USING pglease._history_config AS c
     WHERE h.id IN (SELECT o.id FROM pglease._history AS o ORDER BY o.id LIMIT 1000)
       AND (h.at < clock_timestamp() - c.retention OR h.id <= $1 - c.max_rows);
$$;

REVOKE ALL ON FUNCTION pglease._purge_history(bigint) FROM PUBLIC;

-- Tells the observers of NAME that it changed (see OBSERVERS): called by
-- every function that changes a lease's holder, token, value or
-- step-down request, in the transaction that changes it. Nobody observes
-- if the try succeeds: keep the lock until commit (so that a new observer
-- waits for this change to commit) and send nothing. The payload is a
-- hint (see NOTIFICATIONS). It takes nothing from settings a session can
-- SET but the lock counter (which only makes that session notify more).
-- No SET clause, as _record.
CREATE FUNCTION pglease._changed(name text)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    locks   integer;
    checked text;
BEGIN
    locks := coalesce(nullif(current_setting('pglease.change_locks', true), ''), '0')::integer;
    IF locks >= 0 AND locks < 32 AND pg_try_advisory_xact_lock(1886154594, hashtext(_changed.name)) THEN
        checked := set_config('pglease.change_locks', (locks + 1)::text, true);
    ELSE
        PERFORM pg_notify('pglease_change', hashtext(_changed.name)::text);
    END IF;
END
$$;

REVOKE ALL ON FUNCTION pglease._changed(text) FROM PUBLIC;

------------------------------------------------------------------------
-- force_release(name, reason): end a held lease at once, moving its fence.
------------------------------------------------------------------------

-- Locks NAME's row FOR UPDATE to end the term held under TOKEN (NULL:
-- whoever holds it): the fence, a key, moves. The holder's fenced
-- transactions still open hold the row FOR KEY SHARE; their sessions are
-- ended (_end_fenced), since the token they declared is the one to end,
-- after a 42501 if this session may not act for the lease's role. Returns
-- the row, locked, for the caller to check again; or NULL, nothing locked,
-- when nobody holds the lease under TOKEN. 55P03 if the row is still
-- locked after 2 s by a transaction that cannot be ended. ACTION words the
-- refusals ('force', 'hand over'). Internal.
CREATE FUNCTION pglease._lock_to_end(name text, token bigint, action text)
RETURNS pglease.leases
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    give_up timestamptz := clock_timestamp() + interval '2 seconds';
    lease   pglease.leases;
    note    text;
BEGIN
    LOOP
        SELECT * INTO lease FROM pglease.leases AS l
         WHERE l.name = _lock_to_end.name FOR UPDATE SKIP LOCKED;
        IF FOUND THEN
            RETURN lease;
        END IF;
        SELECT * INTO lease FROM pglease.leases AS l WHERE l.name = _lock_to_end.name;
        IF NOT FOUND OR lease.holder IS NULL OR clock_timestamp() >= lease.expires_at
           OR lease.token <> coalesce(_lock_to_end.token, lease.token) THEN
            RETURN NULL;
        END IF;
        IF NOT pglease._may_act(lease.role) THEN
            PERFORM pglease._refuse_owner(_lock_to_end.name, lease.role, _lock_to_end.action);
        END IF;
        note := pglease._end_fenced(_lock_to_end.name);
        IF note IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = '55P03',
                MESSAGE = format('pglease: cannot %s lease %L: %s', _lock_to_end.action,
                                 _lock_to_end.name, note);
        END IF;
        IF clock_timestamp() >= give_up THEN
            RAISE EXCEPTION USING ERRCODE = '55P03',
                MESSAGE = format('pglease: cannot %s lease %L: its row is still locked after '
                                 '2 s by a transaction that pglease cannot end (a prepared '
                                 'transaction, or a lock taken without pglease.assert_held)',
                                 _lock_to_end.action, _lock_to_end.name);
        END IF;
        PERFORM pg_sleep(0.002);
    END LOOP;
END
$$;

REVOKE ALL ON FUNCTION pglease._lock_to_end(text, bigint, text) FROM PUBLIC;

-- force_release of a name held shared: ends every valid shared holder at
-- once, under the row's lock for shared changes (so that none renews or
-- joins meanwhile), records each in the history with REASON, and ends
-- their open checked transactions (assert_shared's marker), so that an
-- exclusive acquisition is granted at once. Returns the greatest token
-- ended; NULL if none was valid by then. Internal to force_release,
-- which checks the caller.
CREATE FUNCTION pglease._force_shared(name text, reason text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    reader record;
    ended  bigint;
    note   text;
BEGIN
    PERFORM pglease._lock_for_shared(_force_shared.name, true);
    PERFORM pglease._durable();
    FOR reader IN
        UPDATE pglease._shared AS s SET expires_at = clock_timestamp()
         WHERE s.name = _force_shared.name AND s.expires_at > clock_timestamp()
        RETURNING s.*
    LOOP
        PERFORM pglease._record(_force_shared.name, reader.token, 'force_released',
                                reader.holder, clock_timestamp(), reader.renewals,
                                _force_shared.reason);
        ended := greatest(ended, reader.token);
    END LOOP;
    IF ended IS NULL THEN
        RETURN NULL;
    END IF;
    UPDATE pglease.leases AS l SET readers_until = NULL WHERE l.name = _force_shared.name;
    note := pglease._end_fenced(_force_shared.name);
    IF note IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '55P03',
            MESSAGE = format('pglease: cannot force lease %L: %s', _force_shared.name, note);
    END IF;
    PERFORM pg_notify('pglease_release', hashtext(_force_shared.name)::text);
    PERFORM pglease._changed(_force_shared.name);
    RETURN ended;
END
$$;

REVOKE ALL ON FUNCTION pglease._force_shared(text, text) FROM PUBLIC;

CREATE FUNCTION pglease.force_release(name text, reason text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked    text;
    lease      pglease.leases;
BEGIN
    IF NOT coalesce(octet_length(force_release.name) BETWEEN 1 AND pglease._max_text_bytes()
                    AND octet_length(force_release.reason) BETWEEN 1 AND 1000, false) THEN
        checked := pglease._check_text('name', force_release.name);
        IF force_release.reason IS NULL OR octet_length(force_release.reason) = 0 THEN
            RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'reason',
                MESSAGE = 'pglease: reason must not be empty: say why the lease is forced';
        END IF;
        IF octet_length(force_release.reason) > 1000 THEN
            RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'reason',
                MESSAGE = format('pglease: reason is %s bytes long; the limit is 1000 bytes',
                                 octet_length(force_release.reason));
        END IF;
    END IF;
    IF NOT pglease.is_admin() THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('pglease: role %I may not force the release of lease %L: pglease '
                             'administrators only (GRANT pglease_admin TO %I)', session_user,
                             force_release.name, session_user);
    END IF;
    -- It draws a token: not before the server's timeline is checked (see
    -- TIMELINES).
    IF pg_is_in_recovery() THEN
        PERFORM pglease._refuse_standby('force a release');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pglease._checked)
       AND (pglease._timeline_checked(NULL)).timeline IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '55P03',
            MESSAGE = format('pglease: cannot force lease %L: another transaction checking the '
                             'server''s timeline has not committed for 1 s; try again',
                             force_release.name);
    END IF;
    -- A counted lease name (no lease of its own): each slot of its latest
    -- limit, as the lease it is (see COUNTED LEASES).
    IF NOT EXISTS (SELECT 1 FROM pglease.leases AS l WHERE l.name = force_release.name)
       AND EXISTS (SELECT 1 FROM pglease._counted AS n WHERE n.name = force_release.name) THEN
        RETURN (SELECT max(pglease.force_release(format('%s#%s', n.name, k), force_release.reason))
                  FROM pglease._counted AS n, generate_series(1, n.slots) AS k
                 WHERE n.name = force_release.name);
    END IF;
    -- Shared holders: every one of them (see SHARED LEASES).
    IF EXISTS (SELECT 1 FROM pglease._shared AS s
                WHERE s.name = force_release.name AND s.expires_at > clock_timestamp()) THEN
        RETURN pglease._force_shared(force_release.name, force_release.reason);
    END IF;
    -- FOR UPDATE: the fence (a key) moves; the holder's open fenced
    -- transactions are ended first, since the token they declared is the
    -- one to end.
    lease := pglease._lock_to_end(force_release.name, NULL, 'force');
    IF lease.name IS NULL OR lease.holder IS NULL OR clock_timestamp() >= lease.expires_at THEN
        RETURN NULL; -- nobody holds it: nothing to break
    END IF;
    PERFORM pglease._durable();
    PERFORM pglease._record(lease.name, lease.token, 'force_released', lease.holder,
                            clock_timestamp(), lease.renewals, force_release.reason);
    UPDATE pglease.leases AS l
       SET token = nextval('pglease.fence_seq'),
           holder = NULL,
           expires_at = clock_timestamp(),
           released_at = clock_timestamp()
     WHERE l.name = force_release.name;
    -- Sessions declared under the ended term (see DECLARED SESSIONS).
    PERFORM pglease._end_declared(lease.name, lease.token, lease.role);
    -- Wake waiting acquirers at commit, as a release does (rare enough to
    -- notify whether or not anyone watches).
    PERFORM pg_notify('pglease_release', hashtext(force_release.name)::text);
    PERFORM pglease._changed(force_release.name);
    RETURN lease.token;
END
$$;

REVOKE ALL ON FUNCTION pglease.force_release(text, text) FROM PUBLIC;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pglease_admin') THEN
        GRANT USAGE ON SCHEMA pglease TO pglease_admin;
        GRANT EXECUTE ON FUNCTION pglease.force_release(text, text) TO pglease_admin;
        GRANT EXECUTE ON FUNCTION pglease.restored(text), pglease.set_grant_delay(interval)
            TO pglease_admin;
        GRANT SELECT ON pglease.history, pglease.fenced, pglease.protected, pglease.declared,
                        pglease.history_settings, pglease.name_grants, pglease.timelines,
                        pglease.grant_delay TO pglease_admin;
    END IF;
END
$$;

COMMENT ON FUNCTION pglease.force_release(text, text) IS
    'Administrators only (pglease.is_admin()): end lease NAME at once and move its '
    'fence, so that the holder''s token is stale from now on (its renewal fails, its '
    'fenced writes are rejected, its release is ignored), ending its open fenced '
    'transactions; recorded in pglease.history with REASON. A name held shared: every '
    'shared holder ended so, and their open checked transactions. A counted lease name: '
    'each slot of its latest limit. Returns the token ended (the greatest, when several '
    'were), or NULL if nobody held the lease.';
