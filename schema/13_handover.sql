-- =====================================================================
-- 13. HANDOVER TO A NAMED SUCCESSOR
--
-- HANDOVER. hand_over(name, token, successor, ttl): the holder of a valid
-- exclusive lease moves it, in one transaction, to SUCCESSOR when
-- SUCCESSOR waits in the name's line (a live place of its own, for this
-- name alone: see LINES). The term gets a new token, SUCCESSOR as holder,
-- the role that joined the line as its role, and TTL; the place ends, its
-- ticket is recorded (leases.handed_to), and SUCCESSOR's next attempt
-- with that ticket is answered the term (the release notification wakes
-- it at commit). When SUCCESSOR does not wait, the lease is released, as
-- release would. successor_waits(name, token, successor) asks first,
-- read-only (what a leader that prefers a candidate asks every second,
-- before it stops its work and hands over). Either way the old token is refused from the commit on:
-- the row lock hand_over takes (FOR UPDATE, as an acquisition's) first
-- ends the sessions of the holder's fenced transactions still open, as
-- force_release does, so none of them commits after the move. A handover
-- passes over anyone in line before SUCCESSOR: it is the holder's choice.
-- Only the lease's role (its members, administrators) hands over (42501).
-- Not for shared holders' tokens. The history records the old term's
-- 'released' and the new term's 'acquired', each naming the other holder.
-- =====================================================================

-- Whether a lease may be handed over now (raises otherwise): not on a
-- standby, and, since a handover draws a token, as acquire: not before
-- the timeline is checked nor in a grant delay (55P03; see TIMELINES).
-- Internal.
CREATE FUNCTION pglease._may_hand_over(name text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    note text;
BEGIN
    IF pg_is_in_recovery() THEN
        PERFORM pglease._refuse_standby('hand over a lease');
    END IF;
    note := (pglease._no_grant_now('hand_over')).why;
    IF note IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '55P03',
            MESSAGE = format('pglease: cannot hand lease %L over now: %s; release it instead',
                             _may_hand_over.name, note);
    END IF;
END
$$;

REVOKE ALL ON FUNCTION pglease._may_hand_over(text) FROM PUBLIC;

-- Lease NAME's row, FOR UPDATE, once its holder's open fenced
-- transactions have ended (as by force_release), checked valid under
-- TOKEN (LE001) and this session's to act on (42501): what a handover
-- moves. Internal.
CREATE FUNCTION pglease._lock_to_hand(name text, token bigint)
RETURNS pglease.leases
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lease pglease.leases := pglease._lock_to_end(_lock_to_hand.name, _lock_to_hand.token,
                                                 'hand over');
BEGIN
    IF lease.name IS NULL OR lease.token <> _lock_to_hand.token OR lease.holder IS NULL
       OR clock_timestamp() >= lease.expires_at
       OR (lease.session_pid IS NOT NULL
           AND pglease._session_gone(lease.session_pid, lease.session_start)) THEN
        RAISE EXCEPTION USING ERRCODE = 'LE001',
            MESSAGE = format('pglease: lease %L is not held under token %s: only a valid '
                             'lease can be handed over', _lock_to_hand.name, _lock_to_hand.token),
            DETAIL = format('reason=not_held token=%s name=%s', _lock_to_hand.token,
                            _lock_to_hand.name);
    END IF;
    IF lease.role IS DISTINCT FROM session_user AND NOT pglease._may_act(lease.role) THEN
        PERFORM pglease._refuse_owner(_lock_to_hand.name, lease.role, 'hand over');
    END IF;
    RETURN lease;
END
$$;

REVOKE ALL ON FUNCTION pglease._lock_to_hand(text, bigint) FROM PUBLIC;

-- The move itself, shared by hand_over and a group's handover (see
-- GROUPS): LEASE, the row as locked by _lock_to_end and checked valid by
-- the caller, becomes SUCCESSOR's term, under ROLE, for SECONDS, with a
-- new token; TICKET is recorded as handed_to (the successor's next
-- attempt with it is answered the term). Durable, recorded in the
-- history as the old term's 'released' and the new term's 'acquired',
-- and notified. Returns the new token. Internal.
CREATE FUNCTION pglease._hand_to(lease pglease.leases, successor text, role name,
                                 seconds numeric, ticket bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    new_token bigint := nextval('pglease.fence_seq');
BEGIN
    UPDATE pglease.leases AS l
       SET holder = _hand_to.successor,
           role = _hand_to.role,
           token = new_token,
           expires_at = clock_timestamp() + make_interval(secs => _hand_to.seconds::double precision),
           acquired_at = clock_timestamp(),
           renewed_at = NULL,
           released_at = NULL,
           renewals = 0,
           session_pid = NULL,
           session_start = NULL,
           handed_to = _hand_to.ticket
     WHERE l.name = (_hand_to.lease).name;
    -- Durable whatever the session's synchronous_commit (see DURABILITY).
    PERFORM pglease._durable();
    PERFORM pglease._record((_hand_to.lease).name, (_hand_to.lease).token, 'released',
                            (_hand_to.lease).holder, clock_timestamp(), (_hand_to.lease).renewals,
                            format('handed over to %s', _hand_to.successor));
    PERFORM pglease._record((_hand_to.lease).name, new_token, 'acquired', _hand_to.successor,
                            clock_timestamp(), NULL,
                            format('handed over by %s', (_hand_to.lease).holder));
    -- Wakes the successor at commit (rare enough to notify whether or not
    -- anyone watches).
    PERFORM pg_notify('pglease_release', hashtext((_hand_to.lease).name)::text);
    PERFORM pglease._changed((_hand_to.lease).name);
    RETURN new_token;
END
$$;

REVOKE ALL ON FUNCTION pglease._hand_to(pglease.leases, text, name, numeric, bigint) FROM PUBLIC;

CREATE FUNCTION pglease.hand_over(name text, token bigint, successor text, ttl interval,
                                  or_release boolean DEFAULT true)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    seconds  numeric := extract(epoch FROM hand_over.ttl);
    checked  text;
    lease    pglease.leases;
    place    pglease._line;
    waiting  bigint;
BEGIN
    IF NOT coalesce(octet_length(hand_over.name) BETWEEN 1 AND pglease._max_text_bytes()
                    AND hand_over.token IS NOT NULL
                    AND octet_length(hand_over.successor) BETWEEN 1 AND pglease._max_text_bytes()
                    AND seconds > 0 AND seconds <= pglease._max_ttl_seconds(), false) THEN
        checked := pglease._check_text('name', hand_over.name);
        PERFORM pglease._check_token(hand_over.token);
        checked := pglease._check_text('successor', hand_over.successor);
        PERFORM pglease._check_ttl(hand_over.ttl);
    END IF;
    PERFORM pglease._may_hand_over(hand_over.name);

    -- Kept when nobody waits under that name (OR_RELEASE false): a read
    -- first, so that a mistyped successor ends nothing of a valid
    -- holder's. Anything else goes the way below, which says what is
    -- wrong.
    IF NOT hand_over.or_release
       AND pglease._successor_place(hand_over.name, hand_over.successor) IS NULL THEN
        SELECT * INTO lease FROM pglease.leases AS l WHERE l.name = hand_over.name;
        IF lease.token = hand_over.token AND lease.holder IS NOT NULL
           AND clock_timestamp() < lease.expires_at AND lease.session_pid IS NULL
           AND (lease.role = session_user OR pglease._may_act(lease.role)) THEN
            RETURN NULL;
        END IF;
    END IF;

    lease := pglease._lock_to_hand(hand_over.name, hand_over.token);

    -- The successor's live place in this name's line, for this name alone.
    waiting := pglease._successor_place(hand_over.name, hand_over.successor);
    SELECT q.* INTO place FROM pglease._line AS q
     WHERE q.ticket = waiting AND q.name = hand_over.name
       FOR UPDATE OF q;
    IF place.ticket IS NULL THEN
        -- Nobody to hand it to: released, as release would, or kept.
        IF hand_over.or_release THEN
            PERFORM pglease.release(hand_over.name, hand_over.token);
        END IF;
        RETURN NULL;
    END IF;

    DELETE FROM pglease._line AS q WHERE q.ticket = place.ticket;
    RETURN pglease._hand_to(lease, hand_over.successor, place.role, seconds, place.ticket);
END
$$;

COMMENT ON FUNCTION pglease.hand_over(text, bigint, text, interval, boolean) IS
    'Move lease NAME, held under TOKEN, to SUCCESSOR for TTL when SUCCESSOR waits in its '
    'line (first come, first served): a new token, refused to the old holder at once (its '
    'open fenced transactions are ended first). Returns the new token, or NULL when '
    'SUCCESSOR does not wait: the lease was then released instead, or, with OR_RELEASE '
    'false, kept as it was (nothing changed). LE001 if TOKEN is not '
    'valid; 42501 for another role''s lease.';

-- The ticket of SUCCESSOR's live place in NAME's line for this name alone
-- (the one hand_over would take), or NULL. Internal; PL/pgSQL so that its
-- plan is kept for the session (see _may_act).
CREATE FUNCTION pglease._successor_place(name text, successor text)
RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT q.ticket FROM pglease._line AS q
             WHERE q.name = _successor_place.name AND q.holder = _successor_place.successor
               AND pglease._place_lives(q)
               AND NOT EXISTS (SELECT 1 FROM pglease._line AS o
                                WHERE o.ticket = q.ticket AND o.name <> q.name)
             ORDER BY q.ticket
             LIMIT 1);
END
$$;

REVOKE ALL ON FUNCTION pglease._successor_place(text, text) FROM PUBLIC;

CREATE FUNCTION pglease.successor_waits(name text, token bigint, successor text)
RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked text;
    lease   pglease.leases;
BEGIN
    IF NOT coalesce(octet_length(successor_waits.name) BETWEEN 1 AND pglease._max_text_bytes()
                    AND successor_waits.token IS NOT NULL
                    AND octet_length(successor_waits.successor)
                        BETWEEN 1 AND pglease._max_text_bytes(), false) THEN
        checked := pglease._check_text('name', successor_waits.name);
        PERFORM pglease._check_token(successor_waits.token);
        checked := pglease._check_text('successor', successor_waits.successor);
    END IF;
    SELECT * INTO lease FROM pglease.leases AS l WHERE l.name = successor_waits.name;
    IF lease.name IS NULL OR lease.token <> successor_waits.token OR lease.holder IS NULL
       OR clock_timestamp() >= lease.expires_at THEN
        RAISE EXCEPTION USING ERRCODE = 'LE001',
            MESSAGE = format('pglease: lease %L is not held under token %s',
                             successor_waits.name, successor_waits.token),
            DETAIL = format('reason=not_held token=%s name=%s', successor_waits.token,
                            successor_waits.name);
    END IF;
    IF lease.role IS DISTINCT FROM session_user AND NOT pglease._may_act(lease.role) THEN
        PERFORM pglease._refuse_owner(successor_waits.name, lease.role, 'hand over');
    END IF;
    RETURN pglease._successor_place(successor_waits.name, successor_waits.successor) IS NOT NULL;
END
$$;

COMMENT ON FUNCTION pglease.successor_waits(text, bigint, text) IS
    'Whether hand_over(NAME, TOKEN, SUCCESSOR, ...) would hand the lease over now: SUCCESSOR '
    'waits in its line. Read-only; LE001 if TOKEN is not valid, 42501 for another role''s lease.';
