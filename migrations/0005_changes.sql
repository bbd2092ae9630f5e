-- pglease: changes of a lease, notified to its observers; step-down
-- requests.
--
-- OBSERVERS. A session that observes a name (pglease.observe, on a
-- connection that LISTENs on channel pglease_change) is notified of every
-- change of that lease, in commit order: acquired (a new token, also when
-- it takes over an expired lease), released, value published, step-down
-- requested. Renewals are not changes (they only move expires_at), and
-- nothing happens in the database when a lease simply expires: an
-- observer learns that from expires_at and the clock.
--
-- The notification costs what release's does (see 0002_leases.sql: a
-- notifying commit takes a database-wide lock through its flush), so it
-- is sent only when somebody observes, with the handshake release uses
-- for watchers, on its own key space 0x706c6f62 "plob": an observer holds
-- the shared session-level advisory lock (1886154594, hashtext(name)); a
-- change tries the exclusive transaction-level lock on it and notifies if
-- the try fails. If nobody observes, the change keeps the exclusive lock
-- until it commits, so an observe() that comes in the meantime waits for
-- that commit, and the observer's first read (made after observe()
-- returns) sees the change. Either way no change is missed. After 32 such
-- locks in one transaction (pglease.change_locks), the change notifies
-- without asking.
--
-- The change is detected by a trigger on the leases table, so that every
-- function that changes a lease (now and later) is covered and each keeps
-- its single definition. Its WHEN clause is evaluated without calling the
-- trigger function, and renewals (which set expires_at and renewed_at
-- only) do not fire it at all. The function tries the lock first and
-- builds a payload only for an observed name; like the _check helpers it
-- uses only built-in functions (pg_catalog is always searched first) and
-- carries no SET clause, whose save and restore of search_path on every
-- call would be most of its cost. In this project's benchmark the
-- trigger costs an acquire+release cycle 6 to 9 % while nobody observes.
--
-- PAYLOAD. Text, fields separated by one space, the name's length counted
-- in characters so that any name can follow:
--   a <token> <name chars> <name><expires_at, epoch microseconds> <holder>
--   r <token> <name chars> <name>      (also when force_release, 0006,
--                                        moved the fence: the old token)
--   v <token> <name chars> <name><flag> <value>
--       flag '=': the value follows; '-': cleared (NULL); '*': too long
--       for a notification (over 7,000 bytes): read it from pglease.status
--   s <token> <name chars> <name><requested by>
--
-- STEP-DOWN. Anyone may ask the holder of a lease to step down
-- (pglease.request_step_down); the request belongs to the acquisition it
-- was made in (step_down_token), like a value, so the next acquisition
-- starts without one. It changes nothing else: a holder that ignores it
-- keeps its lease. The status view shows it while that acquisition holds.
--
-- The CLOCK, LOCKS, DURABILITY and PRIVILEGES rules of 0001_schema.sql
-- apply to every function here.

ALTER TABLE pglease.leases
    ADD COLUMN step_down_token bigint,
    ADD COLUMN step_down_by    text,
    ADD COLUMN step_down_at    timestamptz;

COMMENT ON COLUMN pglease.leases.step_down_by IS
    'Who asked the holder of token step_down_token to step down (pglease.request_step_down), '
    'at step_down_at.';

CREATE OR REPLACE VIEW pglease.status AS
SELECT l.name,
       l.holder,
       l.token,
       l.expires_at,
       CASE WHEN l.holder IS NOT NULL AND c.t < l.expires_at
            THEN l.expires_at - c.t END AS remaining,
       (l.holder IS NOT NULL AND c.t < l.expires_at) AS held,
       CASE WHEN l.value_token = l.token THEN l.value END AS value,
       CASE WHEN l.step_down_token = l.token AND l.holder IS NOT NULL AND c.t < l.expires_at
            THEN l.step_down_by END AS step_down_requested_by,
       CASE WHEN l.step_down_token = l.token AND l.holder IS NOT NULL AND c.t < l.expires_at
            THEN l.step_down_at END AS step_down_requested_at
  FROM pglease.leases AS l
 CROSS JOIN LATERAL (SELECT clock_timestamp() AS t) AS c
 WHERE l.token > 0;

COMMENT ON VIEW pglease.status IS
    'One row per lease name ever acquired; holder is NULL once released, '
    'remaining is NULL unless held, held uses the database clock; value is the '
    'one the latest acquisition published (NULL if none); step_down_requested_by '
    'and _at say who asked the current holder to step down, and when (NULL if '
    'nobody did, or once the lease is not held).';

------------------------------------------------------------------------
-- observe(name) / unobserve(name): be notified of a lease's changes.
------------------------------------------------------------------------

CREATE FUNCTION pglease.observe(name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_advisory_lock_shared(1886154594, pglease._watch_key(observe.name));
    RETURN true;
END
$$;

COMMENT ON FUNCTION pglease.observe(text) IS
    'Call on a connection that LISTENs on channel pglease_change: from now on, every '
    'change of lease NAME committed by anyone is notified there (see the payload '
    'format in the pglease documentation). Waits for a change of NAME that is '
    'committing, so a read made after it returns sees every change not notified. '
    'Lasts until unobserve(NAME) or the end of the session; calls nest.';

CREATE FUNCTION pglease.unobserve(name text)
RETURNS boolean
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
SET client_min_messages = error
AS $$ SELECT pg_advisory_unlock_shared(1886154594, pglease._watch_key($1)) $$;

COMMENT ON FUNCTION pglease.unobserve(text) IS
    'Undo one observe(NAME) of this session. Returns false if this session did not observe NAME.';

------------------------------------------------------------------------
-- The trigger that notifies observers.
------------------------------------------------------------------------

CREATE FUNCTION pglease._changed()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    locks   integer;
    checked text;
    head    text;
BEGIN
    -- The WHEN clause of the trigger let only changes through. Nobody
    -- observes if the try succeeds: keep the lock until commit (so that a
    -- new observer waits for this change to commit) and send nothing.
    locks := coalesce(nullif(current_setting('pglease.change_locks', true), ''), '0')::integer;
    IF locks < 32 AND pg_try_advisory_xact_lock(1886154594, hashtext(NEW.name)) THEN
        checked := set_config('pglease.change_locks', (locks + 1)::text, true);
        RETURN NULL;
    END IF;
    head := format('%s %s %s', NEW.token, char_length(NEW.name), NEW.name);
    IF NEW.token IS DISTINCT FROM OLD.token AND NEW.holder IS NULL THEN
        -- The fence moved with nobody holding (force_release, 0006): the
        -- old token's term is over, as if released.
        PERFORM pg_notify('pglease_change',
                          format('r %s %s %s', OLD.token, char_length(NEW.name), NEW.name));
    ELSIF NEW.token IS DISTINCT FROM OLD.token THEN
        PERFORM pg_notify('pglease_change',
                          format('a %s%s %s', head,
                                 (extract(epoch FROM NEW.expires_at) * 1000000)::bigint,
                                 NEW.holder));
    ELSIF NEW.holder IS NULL AND OLD.holder IS NOT NULL THEN
        PERFORM pg_notify('pglease_change', format('r %s', head));
    END IF;
    IF (NEW.value_token IS DISTINCT FROM OLD.value_token
        OR NEW.value IS DISTINCT FROM OLD.value) AND NEW.value_token = NEW.token THEN
        PERFORM pg_notify('pglease_change', CASE
            WHEN NEW.value IS NULL THEN format('v %s- ', head)
            WHEN octet_length(NEW.value) > 7000 THEN format('v %s* ', head)
            ELSE format('v %s= %s', head, NEW.value) END);
    END IF;
    IF NEW.step_down_at IS DISTINCT FROM OLD.step_down_at AND NEW.step_down_token = NEW.token THEN
        PERFORM pg_notify('pglease_change', format('s %s%s', head, NEW.step_down_by));
    END IF;
    RETURN NULL;
END
$$;

REVOKE ALL ON FUNCTION pglease._changed() FROM PUBLIC;

CREATE TRIGGER pglease_changed
AFTER UPDATE OF token, holder, value, value_token, step_down_at ON pglease.leases
FOR EACH ROW
WHEN (OLD.token IS DISTINCT FROM NEW.token
      OR OLD.holder IS DISTINCT FROM NEW.holder
      OR OLD.value IS DISTINCT FROM NEW.value
      OR OLD.value_token IS DISTINCT FROM NEW.value_token
      OR OLD.step_down_at IS DISTINCT FROM NEW.step_down_at)
EXECUTE FUNCTION pglease._changed();

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
    asked   bigint;
BEGIN
    IF NOT coalesce(octet_length(request_step_down.name) BETWEEN 1 AND pglease._max_text_bytes()
                    AND octet_length(request_step_down.requested_by)
                        BETWEEN 1 AND pglease._max_text_bytes(), false) THEN
        checked := pglease._check_text('name', request_step_down.name);
        checked := pglease._check_text('requested_by', request_step_down.requested_by);
    END IF;
    UPDATE pglease.leases AS l
       SET step_down_token = l.token,
           step_down_by = request_step_down.requested_by,
           step_down_at = clock_timestamp()
     WHERE l.name = request_step_down.name
       AND l.holder IS NOT NULL
       AND clock_timestamp() < l.expires_at
    RETURNING l.token INTO asked;
    RETURN asked; -- NULL: nobody holds the lease
END
$$;

COMMENT ON FUNCTION pglease.request_step_down(text, text) IS
    'Ask the current holder of lease NAME to step down (release it), on behalf of '
    'REQUESTED_BY; shown in pglease.status and notified to observers. Changes nothing '
    'else: a holder that ignores it keeps the lease. Returns the token of the '
    'acquisition asked, or NULL if nobody holds the lease.';
