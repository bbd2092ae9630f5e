-- =====================================================================
-- 6. CHANGES, NOTIFIED TO OBSERVERS; STEP-DOWN REQUESTS
--
-- OBSERVERS. A session that observes a name (pglease.observe, on a
-- connection that LISTENs on channel pglease_change) is notified of every
-- change of that lease, in commit order: acquired (a new token, also when
-- it takes over an expired lease), released, value published, step-down
-- requested. Renewals are not changes (they only move expires_at), and
-- nothing happens in the database when a lease simply expires: an
-- observer learns that from expires_at and the clock.
--
-- The notification costs what release's does (a notifying commit takes a
-- database-wide lock through its flush, see release), so it is sent only
-- when somebody observes, with the handshake release uses for watchers,
-- on its own key space 0x706c6f62 "plob": an observer holds the shared
-- session-level advisory lock (1886154594, hashtext(name)); a change tries
-- the exclusive transaction-level lock on it and notifies if the try
-- fails. If nobody observes, the change keeps the exclusive lock until it
-- commits, so an observe() that comes in the meantime waits for that
-- commit, and the observer's first read (made after observe() returns)
-- sees the change. Either way no change is missed. After 32 such locks in
-- one transaction (pglease.change_locks), the change notifies without
-- asking.
--
-- Every function that makes a change calls pglease._changed, which tries
-- the lock first and notifies only for an observed name.
--
-- NOTIFICATIONS ARE HINTS. Anyone who can connect may LISTEN on
-- pglease_change and pglease_release, and NOTIFY on them. So the payload
-- of both is only the name's watch key, hashtext(name), in decimal: no
-- token, holder or value, and not the name. A listener that observes or
-- waits for NAME reads the lease through pglease when it hears its key,
-- and believes only what it reads; a forged notification costs it one
-- read. An eavesdropper learns when some lease whose key it hears
-- changed, and can confirm a guessed name against a key.
--
-- STEP-DOWN. Anyone who may acquire a name may ask its holder to step
-- down (pglease.request_step_down); the request belongs to the
-- acquisition it was made in (step_down_token), like a value, so the next
-- acquisition starts without one, and only its first request counts. It changes nothing else: a holder that ignores it
-- keeps its lease. The status view shows it while that acquisition holds.
-- =====================================================================

-- LATER PARTS. Used here, defined in a later part (PL/pgSQL looks a
-- name up when a function runs, not when it is created): 7: _changed,
-- _record.

------------------------------------------------------------------------
-- observe(name) / unobserve(name): be notified of a lease's changes.
------------------------------------------------------------------------

-- The shared lock waits for a change that is committing (milliseconds),
-- polling, for at most 2 s: anyone can hold the key exclusively, and then
-- observe answers false with a WARNING naming who holds it (the changes
-- of NAME are notified while they do, but not after, so the caller reads
-- the lease instead).
CREATE FUNCTION pglease.observe(name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    key     integer := pglease._watch_key(observe.name);
    give_up timestamptz := clock_timestamp() + interval '2 seconds';
BEGIN
    LOOP
        IF pg_try_advisory_lock_shared(1886154594, key) THEN
            RETURN true;
        END IF;
        IF clock_timestamp() >= give_up THEN
            RAISE WARNING USING MESSAGE = format(
                'pglease: cannot observe lease %L: its observer key (1886154594, %s) has been '
                'held exclusively for 2 s by %s, not by pglease; read the lease instead',
                observe.name, key, pglease._key_holders(1886154594, key, 2));
            RETURN false;
        END IF;
        PERFORM pg_sleep(0.002);
    END LOOP;
END
$$;

COMMENT ON FUNCTION pglease.observe(text) IS
    'Call on a connection that LISTENs on channel pglease_change: from now on, every '
    'change of lease NAME committed by anyone is notified there, with payload '
    'hashtext(NAME): a hint to read pglease.status, never a fact (anyone may NOTIFY). '
    'Waits for a change of NAME that is '
    'committing, so a read made after it returns sees every change not notified. '
    'Lasts until unobserve(NAME) or the end of the session; calls nest. Returns false '
    'after 2 s if another session holds its key exclusively (a WARNING says who).';

CREATE FUNCTION pglease.unobserve(name text)
RETURNS boolean
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
SET client_min_messages = error
AS $$ SELECT pg_advisory_unlock_shared(1886154594, pglease._watch_key($1)) $$;

COMMENT ON FUNCTION pglease.unobserve(text) IS
    'Undo one observe(NAME) of this session. Returns false if this session did not observe NAME.';

------------------------------------------------------------------------
-- request_step_down(name, by): ask the current holder to step down.
------------------------------------------------------------------------

CREATE FUNCTION pglease.request_step_down(name text, requested_by text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked text;
    asked   record;
    held_token bigint;
BEGIN
    IF NOT coalesce(octet_length(request_step_down.name) BETWEEN 1 AND pglease._max_text_bytes()
                    AND octet_length(request_step_down.requested_by)
                        BETWEEN 1 AND pglease._max_text_bytes(), false) THEN
        checked := pglease._check_text('name', request_step_down.name);
        checked := pglease._check_text('requested_by', request_step_down.requested_by);
    END IF;
    IF NOT pglease._may_use_name(request_step_down.name) THEN
        PERFORM pglease._refuse_name(request_step_down.name, 'ask the holder of');
    END IF;
    -- The first request of a term is recorded; later ones change nothing
    -- (one history row per term, whoever asks how often).
    UPDATE pglease.leases AS l
       SET step_down_token = l.token,
           step_down_by = request_step_down.requested_by,
           step_down_at = clock_timestamp()
     WHERE l.name = request_step_down.name
       AND l.holder IS NOT NULL
       AND clock_timestamp() < l.expires_at
       AND l.step_down_token IS DISTINCT FROM l.token
    RETURNING l.token, l.holder, l.step_down_at INTO asked;
    IF FOUND THEN
        PERFORM pglease._record(request_step_down.name, asked.token, 'step_down_requested',
                                asked.holder, asked.step_down_at, NULL,
                                request_step_down.requested_by);
        PERFORM pglease._changed(request_step_down.name);
        RETURN asked.token;
    END IF;
    SELECT l.token INTO held_token FROM pglease.leases AS l
     WHERE l.name = request_step_down.name
       AND l.holder IS NOT NULL AND clock_timestamp() < l.expires_at;
    RETURN held_token; -- NULL: nobody holds the lease
END
$$;

COMMENT ON FUNCTION pglease.request_step_down(text, text) IS
    'Ask the current holder of lease NAME to step down (release it), on behalf of '
    'REQUESTED_BY; shown in pglease.status and notified to observers. Changes nothing '
    'else: a holder that ignores it keeps the lease. Only the first request of a term '
    'is recorded. Returns the token of the acquisition asked, or NULL if nobody holds '
    'the lease.';
