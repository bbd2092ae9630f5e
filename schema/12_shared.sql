-- =====================================================================
-- 12. SHARED LEASES: MANY HOLDERS AT ONCE, OR ONE
--
-- MODES. A name is acquired exclusive (acquire: one holder, as always)
-- or shared (acquire_shared: any number of holders at once). Each shared
-- holder has its own token, drawn from fence_seq, its own expiry and its
-- own row in pglease._shared. An exclusive acquisition needs no valid
-- exclusive holder and no valid shared holder; a shared acquisition needs
-- no valid exclusive holder. What an exclusive acquisition decides on is
-- on the name's row: readers_until, the latest expiry of a valid shared
-- holder, which every change of a shared holder (acquire_shared, and
-- renew and release under a shared token) sets under that row's lock, so
-- that it never understates one and never outlasts them all (a renewal
-- that shortens the lease, or a release, recomputes it from the valid
-- holders); the decision is re-evaluated on the
-- latest row version like every other.
--
-- WRITER PREFERENCE. An exclusive acquisition refused because of shared
-- holders marks the name if it waits: one sent with WAITS (the library's
-- acquisitions that wait), or one that comes back within 5 s of its last
-- refusal (a loop in SQL). The mark is writer_waiting (its holder) and
-- writer_waits_until, 5 s from now (sooner if the shared holders' latest
-- expiry is sooner: then 3 s after it). One that will not wait leaves
-- only a note (its holder, and writer_waits_until at the refusal's time),
-- so that nobody is kept out on behalf of an acquirer that has gone. While the mark lasts, a shared
-- acquisition is refused and told that the waiting exclusive acquirer
-- holds the name until the mark ends. The refused exclusive acquisition
-- is told to come back within 2 s (its answer's expires_at is the shared
-- holders' latest expiry or 2 s from now, whichever is sooner), so that
-- one that waits renews the mark before it ends; one that stops
-- attempting (gave up, or died) keeps new shared holders out for 5 s at
-- most. Shared holders already in keep their leases and may renew them:
-- only new ones wait. An exclusive acquisition clears the mark.
--
-- FENCING. assert_shared(name, token) is a shared holder's check: the
-- same FOR KEY SHARE on the name's row and the same marker as assert_held
-- takes, so that no exclusive acquisition commits while a shared holder's
-- checked transaction is open, and an exclusive acquisition after every
-- shared holder has ended ends their frozen transactions as it ends an
-- exclusive holder's (see TAKEOVER). It declares nothing: assert_held and
-- protected tables accept only the exclusive holder's token (a shared
-- token gets LE001, reason=shared). The first shared acquisition after an
-- exclusive term locks the row FOR UPDATE as an exclusive acquisition
-- does, ending that term's stale fenced transactions (readers_after
-- records the term so cleared), so that no shared holder reads beside a
-- stale writer's open transaction.
--
-- NOT SHARED: session-bound, counted and several-at-once acquisitions, a
-- place in line (a shared acquisition waits behind everyone in line but
-- takes no place), values, step-down requests (an election's leader is
-- exclusive). force_release ends every shared holder at once
-- (_force_shared). History: 'acquired' and 'released' rows with detail
-- 'shared', 'force_released' with the reason; an expiry is not recorded.
-- =====================================================================

CREATE TABLE pglease._shared (
    token       bigint      NOT NULL PRIMARY KEY,
    name        text        NOT NULL,
    holder      text        NOT NULL,
    -- The login role of the acquisition (see AUTHORITY).
    role        name        NOT NULL,
    acquired_at timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    renewed_at  timestamptz,
    renewals    integer     NOT NULL DEFAULT 0
);

CREATE INDEX _shared_name ON pglease._shared (name, expires_at);

REVOKE ALL ON pglease._shared FROM PUBLIC;

-- An exclusive acquisition by HOLDER found NAME held shared: mark the
-- name (see WRITER PREFERENCE) if it WAITS or comes back within 5 s of
-- its last refusal, else only note it (writer_waiting, and the refusal's
-- time in writer_waits_until: no shared acquisition waits behind that),
-- unless another transaction changes the row right now (the next attempt
-- marks it then). Answers acquire's refusal: "held" by the shared holder
-- that expires last, until that expiry or for 2 s, whichever ends first;
-- AHEAD and FAIR as acquire answers them. NULL if the shared holders have
-- just ended: the caller goes on. Internal to acquire.
CREATE FUNCTION pglease._writer_waits(name text, holder text, ahead integer, waits boolean,
                                      fair boolean)
RETURNS pglease.acquisition
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    until  timestamptz;
    marked timestamptz;
    noted  text;
    reader text;
    t      timestamptz;
BEGIN
    SELECT l.readers_until, l.writer_waits_until, l.writer_waiting INTO until, marked, noted
      FROM pglease.leases AS l
     WHERE l.name = _writer_waits.name FOR NO KEY UPDATE SKIP LOCKED;
    IF FOUND THEN
        t := clock_timestamp();
        IF until > t AND (_writer_waits.waits
                          OR (noted = _writer_waits.holder AND marked > t - interval '5 seconds')) THEN
            UPDATE pglease.leases AS l
               SET writer_waiting = _writer_waits.holder,
                   writer_waits_until = greatest(l.writer_waits_until,
                                                 least(until, t + interval '2 seconds')
                                                 + interval '3 seconds')
             WHERE l.name = _writer_waits.name;
        ELSIF until > t AND NOT coalesce(marked > t, false) THEN
            UPDATE pglease.leases AS l
               SET writer_waiting = _writer_waits.holder, writer_waits_until = t
             WHERE l.name = _writer_waits.name;
        END IF;
    ELSE
        SELECT l.readers_until INTO until FROM pglease.leases AS l
         WHERE l.name = _writer_waits.name;
    END IF;
    t := clock_timestamp();
    until := CASE WHEN until > t THEN least(until, t + interval '2 seconds') ELSE t END;
    SELECT s.holder INTO reader FROM pglease._shared AS s
     WHERE s.name = _writer_waits.name AND s.expires_at > clock_timestamp()
     ORDER BY s.expires_at DESC LIMIT 1;
    t := clock_timestamp();
    IF NOT until > t THEN
        RETURN NULL;
    END IF;
    RETURN ROW(NULL, until, reader, t, NULL, NULL, NULL, _writer_waits.ahead,
               _writer_waits.fair)::pglease.acquisition;
END
$$;

REVOKE ALL ON FUNCTION pglease._writer_waits(text, text, integer, boolean, boolean) FROM PUBLIC;

CREATE FUNCTION pglease.acquire_shared(name text, holder text, ttl interval)
RETURNS pglease.acquisition
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    seconds   numeric := extract(epoch FROM acquire_shared.ttl);
    checked   text;
    lease     pglease.leases;
    delayed   timestamptz;
    gone      boolean;
    t         timestamptz;
    note      text;
    ahead     integer;
    new_token bigint;
    expiry    timestamptz;
BEGIN
    IF NOT coalesce(octet_length(acquire_shared.name) BETWEEN 1 AND pglease._max_text_bytes()
                    AND octet_length(acquire_shared.holder) BETWEEN 1 AND pglease._max_text_bytes()
                    AND seconds > 0 AND seconds <= pglease._max_ttl_seconds(), false) THEN
        checked := pglease._check_text('name', acquire_shared.name);
        checked := pglease._check_text('holder', acquire_shared.holder);
        PERFORM pglease._check_ttl(acquire_shared.ttl);
    END IF;
    IF pg_is_in_recovery() THEN
        PERFORM pglease._refuse_standby('acquire a lease');
    END IF;
    -- No token before the timeline is checked, none in a grant delay
    -- (see TIMELINES).
    SELECT g.why, g.delayed_until INTO note, delayed FROM pglease._no_grant_now('acquire_shared') AS g;
    IF note IS NOT NULL THEN
        t := clock_timestamp();
        RETURN ROW(NULL, t, NULL, t, note, NULL, delayed, NULL, NULL)::pglease.acquisition;
    END IF;
    IF NOT pglease._may_use_name(acquire_shared.name) THEN
        PERFORM pglease._refuse_name(acquire_shared.name, 'acquire');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pglease.leases AS l WHERE l.name = acquire_shared.name) THEN
        note := pglease._create(acquire_shared.name);
        IF note IS NOT NULL THEN
            t := clock_timestamp();
            RETURN ROW(NULL, t, NULL, t, note, NULL, NULL, NULL, NULL)::pglease.acquisition;
        END IF;
    END IF;

    -- The row's lock, as renew's: concurrent shared acquisitions take
    -- turns on it for milliseconds, and no exclusive acquisition decides
    -- meanwhile. Bounded like every wait here.
    note := pglease._lock_for_shared(acquire_shared.name, false);
    SELECT * INTO lease FROM pglease.leases AS l WHERE l.name = acquire_shared.name;
    IF note IS NOT NULL THEN
        RETURN ROW(NULL, lease.expires_at, lease.holder, clock_timestamp(), note,
                   lease.session_pid, NULL, NULL, NULL)::pglease.acquisition;
    END IF;

    t := clock_timestamp();
    gone := lease.session_pid IS NOT NULL
            AND pglease._session_gone(lease.session_pid, lease.session_start);
    IF lease.holder IS NOT NULL AND t < lease.expires_at AND NOT gone THEN
        RETURN ROW(NULL, lease.expires_at, lease.holder, t, NULL, lease.session_pid, NULL,
                   NULL, NULL)::pglease.acquisition;
    END IF;
    IF lease.writer_waits_until > t THEN
        RETURN ROW(NULL, lease.writer_waits_until, lease.writer_waiting, t,
                   'an exclusive acquisition waits for the shared holders to end (writer '
                   'preference): new shared holders wait behind it',
                   NULL, NULL, NULL, NULL)::pglease.acquisition;
    END IF;
    IF lease.queued THEN
        ahead := pglease._ahead(acquire_shared.name, NULL, acquire_shared.ttl);
        IF ahead > 0 THEN
            RETURN ROW(NULL, t, NULL, t,
                       format('first come, first served: %s acquirer(s) wait in line before '
                              'this one', ahead),
                       NULL, NULL, ahead, NULL)::pglease.acquisition;
        END IF;
    END IF;

    -- The first shared holder after an exclusive term: that term's stale
    -- fenced transactions end first (see FENCING above). While shared
    -- holders are valid, that was done when the first of them came.
    IF lease.token > 0 AND lease.readers_after IS DISTINCT FROM lease.token
       AND NOT coalesce(lease.readers_until > t, false) THEN
        PERFORM 1 FROM pglease.leases AS l
         WHERE l.name = acquire_shared.name FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            SELECT o.note INTO note
              FROM pglease._take_over(acquire_shared.name,
                                      CASE WHEN gone THEN lease.token END) AS o;
            IF note IS NOT NULL THEN
                -- '' cannot be: nobody acquires while this holds the row,
                -- and no shared holder is valid.
                RETURN ROW(NULL, lease.expires_at, lease.holder, clock_timestamp(),
                           nullif(note, ''), lease.session_pid, NULL, NULL, NULL)::pglease.acquisition;
            END IF;
        END IF;
        IF gone THEN
            -- The term of a session-bound holder whose session has ended
            -- ends now, on the row too: its token is refused from here on
            -- even if its process id comes back (see SESSION-BOUND LEASES).
            PERFORM pglease._record(lease.name, lease.token, 'expired', lease.holder,
                                    clock_timestamp(), lease.renewals,
                                    'its holder''s session ended');
            UPDATE pglease.leases AS l SET expires_at = clock_timestamp()
             WHERE l.name = acquire_shared.name;
        END IF;
    END IF;

    new_token := nextval('pglease.fence_seq');
    expiry := clock_timestamp() + make_interval(secs => seconds::double precision);
    -- Ended shared holders of the name go.
    DELETE FROM pglease._shared AS s
     WHERE s.name = acquire_shared.name AND s.expires_at <= clock_timestamp();
    INSERT INTO pglease._shared (token, name, holder, role, acquired_at, expires_at)
    VALUES (new_token, acquire_shared.name, acquire_shared.holder, session_user,
            clock_timestamp(), expiry);
    UPDATE pglease.leases AS l
       SET readers_until = greatest(l.readers_until, expiry),
           readers_after = l.token
     WHERE l.name = acquire_shared.name;
    -- Durable whatever the session's synchronous_commit (see DURABILITY).
    PERFORM pglease._durable();
    PERFORM pglease._record(acquire_shared.name, new_token, 'acquired', acquire_shared.holder,
                            clock_timestamp(), NULL, 'shared');
    PERFORM pglease._changed(acquire_shared.name);
    RETURN ROW(new_token, expiry, acquire_shared.holder, t, NULL, NULL, NULL,
               NULL, NULL)::pglease.acquisition;
END
$$;

COMMENT ON FUNCTION pglease.acquire_shared(text, text, interval) IS
    'Acquire lease NAME shared for HOLDER for TTL: granted beside other shared holders, '
    'unless an exclusive holder holds it, an exclusive acquisition waits for the shared '
    'holders (writer preference), or acquirers wait in line. Returns what acquire returns; '
    'the token is this holder''s own. Renew and release it with renew and release; check '
    'it in a transaction with assert_shared. Answers within about 2 s.';

-- Locks NAME's row FOR NO KEY UPDATE for a change of a shared holder,
-- waiting at most 1 s for the transaction that holds it (an acquisition
-- or another shared holder's change, milliseconds), so that a transaction
-- left open delays a change but never blocks it. NULL once locked; after
-- 1 s, why not: raised as 55P03 when REFUSE, else returned (for a refusal
-- row). Internal.
CREATE FUNCTION pglease._lock_for_shared(name text, refuse boolean)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    give_up timestamptz := clock_timestamp() + interval '1 second';
    why     text;
BEGIN
    LOOP
        PERFORM 1 FROM pglease.leases AS l
         WHERE l.name = _lock_for_shared.name FOR NO KEY UPDATE SKIP LOCKED;
        IF FOUND THEN
            RETURN NULL;
        END IF;
        IF clock_timestamp() >= give_up THEN
            why := 'its row has been locked for over 1 s by a transaction that has not '
                   'committed (call acquire, acquire_shared, renew and release in transactions '
                   'of their own)';
            IF NOT refuse THEN
                RETURN why;
            END IF;
            RAISE EXCEPTION USING ERRCODE = '55P03',
                MESSAGE = format('pglease: lease %L: %s; try again', _lock_for_shared.name, why);
        END IF;
        PERFORM pg_sleep(0.002);
    END LOOP;
END
$$;

REVOKE ALL ON FUNCTION pglease._lock_for_shared(text, boolean) FROM PUBLIC;

-- The valid shared holder of NAME under TOKEN, if this session may act
-- under it (42501 if it may not); NULL if there is none. Read before any
-- lock is taken, so that nobody locks a row under a token not its own.
CREATE FUNCTION pglease._own_shared(name text, token bigint)
RETURNS pglease._shared
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    reader pglease._shared;
BEGIN
    SELECT * INTO reader FROM pglease._shared AS s
     WHERE s.token = _own_shared.token AND s.name = _own_shared.name
       AND clock_timestamp() < s.expires_at;
    IF reader.token IS NOT NULL AND reader.role IS DISTINCT FROM session_user
       AND NOT pglease._may_act(reader.role) THEN
        PERFORM pglease._refuse_owner(_own_shared.name, reader.role, 'act under');
    END IF;
    RETURN reader;
END
$$;

REVOKE ALL ON FUNCTION pglease._own_shared(text, bigint) FROM PUBLIC;

-- renew(NAME, TOKEN, TTL) for a shared holder's TOKEN: the new expiry,
-- or NULL if TOKEN is no valid shared holder's of NAME (42501 if it is
-- one this session may not act under). The name's row is locked first,
-- so that no exclusive acquisition decides between the two updates.
CREATE FUNCTION pglease._renew_shared(name text, token bigint, ttl interval)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    new_expiry timestamptz;
BEGIN
    IF (pglease._own_shared(_renew_shared.name, _renew_shared.token)).token IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM pglease._lock_for_shared(_renew_shared.name, true);
    UPDATE pglease._shared AS s
       SET expires_at = clock_timestamp()
                        + make_interval(secs => date_part('epoch', _renew_shared.ttl)),
           renewed_at = clock_timestamp(),
           renewals = s.renewals + 1
     WHERE s.token = _renew_shared.token AND s.name = _renew_shared.name
       AND clock_timestamp() < s.expires_at
    RETURNING s.expires_at INTO new_expiry;
    IF new_expiry IS NOT NULL THEN
        -- Recomputed, not raised: a renewal may shorten the lease, and an
        -- exclusive acquisition waits only for shared holders that are
        -- valid (see SHARED LEASES).
        UPDATE pglease.leases AS l
           SET readers_until = (SELECT max(s.expires_at) FROM pglease._shared AS s
                                 WHERE s.name = _renew_shared.name
                                   AND s.expires_at > clock_timestamp())
         WHERE l.name = _renew_shared.name;
    END IF;
    RETURN new_expiry;
END
$$;

REVOKE ALL ON FUNCTION pglease._renew_shared(text, bigint, interval) FROM PUBLIC;

-- release(NAME, TOKEN) for a shared holder's TOKEN: true if it ended a
-- valid shared lease (42501 if it is one this session may not act
-- under). The row stays, ended (expires_at now), until the name's next
-- shared acquisition purges it: a shared holder's check in a REPEATABLE
-- READ transaction that began before the release then fails to serialize
-- instead of reading the row as it was. readers_until becomes the latest
-- expiry of the others, read after the name's row is locked.
CREATE FUNCTION pglease._release_shared(name text, token bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    gone pglease._shared;
BEGIN
    IF (pglease._own_shared(_release_shared.name, _release_shared.token)).token IS NULL THEN
        RETURN false;
    END IF;
    PERFORM pglease._lock_for_shared(_release_shared.name, true);
    UPDATE pglease._shared AS s
       SET expires_at = clock_timestamp()
     WHERE s.token = _release_shared.token AND s.name = _release_shared.name
       AND clock_timestamp() < s.expires_at
    RETURNING s.* INTO gone;
    IF gone.token IS NULL THEN
        RETURN false;
    END IF;
    UPDATE pglease.leases AS l
       SET readers_until = (SELECT max(s.expires_at) FROM pglease._shared AS s
                             WHERE s.name = _release_shared.name
                               AND s.expires_at > clock_timestamp())
     WHERE l.name = _release_shared.name;
    PERFORM pglease._record(_release_shared.name, gone.token, 'released', gone.holder,
                            clock_timestamp(), gone.renewals, 'shared');
    RETURN true;
END
$$;

REVOKE ALL ON FUNCTION pglease._release_shared(text, bigint) FROM PUBLIC;

CREATE FUNCTION pglease.assert_shared(name text, token bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked   text;
    secret    bytea;
    reader    pglease._shared;
    t         timestamptz;
    marker    bigint;
BEGIN
    IF NOT coalesce(octet_length(assert_shared.name) BETWEEN 1 AND pglease._max_text_bytes()
                    AND assert_shared.token IS NOT NULL, false) THEN
        checked := pglease._check_text('name', assert_shared.name);
        PERFORM pglease._check_token(assert_shared.token);
    END IF;
    -- As assert_held: held until the caller's transaction ends, it keeps
    -- every exclusive acquisition of the name from committing.
    SELECT l.secret INTO secret FROM pglease.leases AS l
     WHERE l.name = assert_shared.name FOR KEY SHARE;
    -- FOR KEY SHARE: in a REPEATABLE READ transaction, a release or
    -- renewal committed since its snapshot fails to serialize (40001)
    -- rather than pass unseen; it conflicts with neither.
    SELECT * INTO reader FROM pglease._shared AS s
     WHERE s.token = assert_shared.token AND s.name = assert_shared.name FOR KEY SHARE;
    -- The clock is read after the lock is held.
    t := clock_timestamp();
    IF reader.token IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'LE001',
            MESSAGE = format('pglease: lease %L is not held shared under token %s: no shared '
                             'holder has that token (released, ended and purged, or never '
                             'issued)', assert_shared.name, assert_shared.token),
            DETAIL = format('reason=not_shared token=%s name=%s', assert_shared.token,
                            assert_shared.name);
    END IF;
    IF t >= reader.expires_at THEN
        RAISE EXCEPTION USING ERRCODE = 'LE001',
            MESSAGE = format('pglease: lease %L is not held shared under token %s: it expired '
                             'at %s (database time now %s)', assert_shared.name,
                             assert_shared.token, reader.expires_at, t),
            DETAIL = format('reason=expired token=%s at=%s name=%s', assert_shared.token,
                            to_char(reader.expires_at AT TIME ZONE 'UTC',
                                    'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                            assert_shared.name);
    END IF;
    IF reader.role IS DISTINCT FROM session_user AND NOT pglease._may_act(reader.role) THEN
        PERFORM pglease._refuse_owner(assert_shared.name, reader.role, 'read under');
    END IF;
    -- The marker, as assert_held takes it: an exclusive acquisition
    -- after this holder has ended ends this transaction's session.
    marker := pglease._marker(secret, pg_current_xact_id()::xid);
    IF NOT pg_try_advisory_xact_lock_shared(marker) THEN
        RAISE EXCEPTION USING ERRCODE = '55P03',
            MESSAGE = format('pglease: lease %L: this transaction''s fenced marker is held '
                             'exclusively by another session (%s)', assert_shared.name,
                             pglease._key_holders(marker >> 32, marker, 1));
    END IF;
END
$$;

COMMENT ON FUNCTION pglease.assert_shared(text, bigint) IS
    'Inside a transaction: fail with SQLSTATE LE001 unless TOKEN is a valid shared '
    'holder''s of lease NAME, and keep every exclusive acquisition of NAME from committing '
    'until this transaction ends. Declares nothing: writes to protected tables need the '
    'exclusive holder''s token.';

-- The shared holders of every name, valid ones only.
CREATE VIEW pglease.shared AS
SELECT s.name, s.token, s.holder, s.role, s.acquired_at, s.expires_at, s.renewed_at,
       s.renewals
  FROM pglease._shared AS s
 WHERE s.expires_at > clock_timestamp();

REVOKE ALL ON pglease.shared FROM PUBLIC;

COMMENT ON VIEW pglease.shared IS
    'The valid shared holders of every lease: name, token, holder, role, acquired_at, '
    'expires_at, renewed_at, renewals.';

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pglease_admin') THEN
        GRANT SELECT ON pglease.shared TO pglease_admin;
    END IF;
END
$$;
