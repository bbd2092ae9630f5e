-- pglease: the history of every lease, and a break-glass release that
-- fences.
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
-- The rows are written by a trigger on the leases table, like the
-- notifications of 0005_changes.sql, so that every function that changes
-- a lease is covered and keeps its single definition. Renewals fire only
-- the counting trigger (BEFORE UPDATE OF renewed_at).
--
-- RETENTION. Rows older than pglease.history_retention (a setting:
-- ALTER DATABASE ... SET pglease.history_retention = '7 days'; default 30
-- days; '0' records nothing) are deleted by the transitions themselves, no
-- daemon: one in 128 looks at the 1,000 oldest rows and deletes those
-- past the retention.
--
-- COST. Recording is two inserts per acquire+release cycle: in this
-- project's benchmark (fsync-bound, loopback) such cycles ran at 0.76 to
-- 0.98 of their rate without it, and renew_many of 1,000 leases took 1.08
-- to 1.14 times as long with the renewal count. A lease that changes hands
-- thousands of times a second can do without: set the retention to '0'
-- (the renewal count stays).
--
-- FORCE RELEASE. pglease.force_release(name, reason) ends a held lease at
-- once and moves its fence: the lease gets a new token that nobody holds,
-- so the old holder's token is stale from that instant (its renewal
-- fails, its fenced writes are rejected, its release is ignored), and the
-- old holder's open fenced transactions are ended like a takeover's
-- (their sessions, which need pg_signal_backend for the owner, see
-- 0002_leases.sql). It is not granted to PUBLIC: GRANT EXECUTE to an
-- administrator role.
--
-- The CLOCK, LOCKS, DURABILITY and PRIVILEGES rules of 0001_schema.sql
-- apply to every function here.

CREATE TABLE pglease._history (
    id     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name   text        NOT NULL,
    token  bigint      NOT NULL,
    event  text        NOT NULL CHECK (event IN ('acquired', 'released', 'expired',
                                                  'evicted', 'force_released', 'value',
                                                  'step_down_requested')),
    holder text,
    at     timestamptz NOT NULL,
    renewals integer,
    detail text
);

CREATE INDEX _history_name ON pglease._history (name, id);

REVOKE ALL ON pglease._history FROM PUBLIC;

CREATE VIEW pglease.history AS
SELECT h.id, h.name, h.token, h.event, h.holder, h.at, h.renewals, h.detail
  FROM pglease._history AS h;

COMMENT ON VIEW pglease.history IS
    'Every transition of every lease, oldest first by id: acquired, released, expired '
    '(recorded at the next acquisition, at the time it expired), evicted (sessions still '
    'fenced under the old token were ended; detail: their process ids), force_released '
    '(detail: the reason), value (detail: the value), step_down_requested (detail: by whom); '
    'renewals is the term''s renewal count on the row that ends it. Kept for '
    'pglease.history_retention (default 30 days).';

ALTER TABLE pglease.leases ADD COLUMN renewals integer NOT NULL DEFAULT 0;

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
            THEN l.step_down_at END AS step_down_requested_at,
       l.renewals
  FROM pglease.leases AS l
 CROSS JOIN LATERAL (SELECT clock_timestamp() AS t) AS c
 WHERE l.token > 0;

COMMENT ON VIEW pglease.status IS
    'One row per lease name ever acquired; holder is NULL once released, '
    'remaining is NULL unless held, held uses the database clock; value is the '
    'one the latest acquisition published (NULL if none); step_down_requested_by '
    'and _at say who asked the current holder to step down, and when (NULL if '
    'nobody did, or once the lease is not held); renewals counts the latest '
    'acquisition''s renewals.';

------------------------------------------------------------------------
-- The triggers that keep the history.
------------------------------------------------------------------------

-- Counts a term's renewals; a new acquisition starts from zero. Like the
-- trigger of 0005, no SET clause (only built-ins, pg_catalog first).
CREATE FUNCTION pglease._count_renewal()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF NEW.token = OLD.token THEN
        NEW.renewals := OLD.renewals + 1;
    ELSE
        NEW.renewals := 0;
    END IF;
    RETURN NEW;
END
$$;

REVOKE ALL ON FUNCTION pglease._count_renewal() FROM PUBLIC;

CREATE TRIGGER pglease_count_renewal
BEFORE UPDATE OF renewed_at, token ON pglease.leases
FOR EACH ROW
WHEN (OLD.renewed_at IS DISTINCT FROM NEW.renewed_at OR OLD.token IS DISTINCT FROM NEW.token)
EXECUTE FUNCTION pglease._count_renewal();

-- pglease.history_retention as an interval: 30 days when unset, and when
-- it is not an interval (a typo must not stop leases from changing hands:
-- it is reported as a WARNING instead).
CREATE FUNCTION pglease._history_retention()
RETURNS interval
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    setting text := nullif(current_setting('pglease.history_retention', true), '');
BEGIN
    IF setting IS NULL THEN
        RETURN interval '30 days';
    END IF;
    BEGIN
        RETURN setting::interval;
    EXCEPTION WHEN OTHERS THEN
        RAISE WARNING USING MESSAGE = format(
            'pglease: pglease.history_retention = %L is not an interval; keeping 30 days', setting);
        RETURN interval '30 days';
    END;
END
$$;

CREATE FUNCTION pglease._record()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    new_id    bigint;
    evicted   text;
    retention interval := pglease._history_retention();
BEGIN
    IF retention <= interval '0' THEN
        RETURN NULL; -- history off
    END IF;
    IF NEW.token IS DISTINCT FROM OLD.token THEN
        -- The term before ended without a release: it expired, or an
        -- administrator moved the fence (force_release, which says why).
        IF OLD.holder IS NOT NULL AND OLD.token > 0 THEN
            IF NEW.holder IS NULL THEN
                INSERT INTO pglease._history (name, token, event, holder, at, renewals, detail)
                VALUES (NEW.name, OLD.token, 'force_released', OLD.holder, clock_timestamp(),
                        OLD.renewals, nullif(current_setting('pglease.reason', true), ''));
            ELSE
                INSERT INTO pglease._history (name, token, event, holder, at, renewals)
                VALUES (NEW.name, OLD.token, 'expired', OLD.holder, OLD.expires_at, OLD.renewals);
            END IF;
        END IF;
        -- Sessions fenced under the old token that this transaction ended
        -- (set by _end_fenced, 0002_leases.sql), however the term ended.
        evicted := current_setting('pglease.evicted', true);
        IF split_part(evicted, ':', 1) = NEW.id::text THEN
            INSERT INTO pglease._history (name, token, event, holder, at, detail)
            VALUES (NEW.name, OLD.token, 'evicted', OLD.holder, clock_timestamp(),
                    'ended sessions ' || split_part(evicted, ':', 2));
            PERFORM set_config('pglease.evicted', '', true);
        END IF;
        IF NEW.holder IS NOT NULL THEN
            INSERT INTO pglease._history (name, token, event, holder, at)
            VALUES (NEW.name, NEW.token, 'acquired', NEW.holder, NEW.acquired_at)
            RETURNING _history.id INTO new_id;
        END IF;
    ELSIF NEW.holder IS NULL AND OLD.holder IS NOT NULL THEN
        INSERT INTO pglease._history (name, token, event, holder, at, renewals)
        VALUES (NEW.name, NEW.token, 'released', OLD.holder, NEW.released_at, NEW.renewals)
        RETURNING _history.id INTO new_id;
    END IF;
    IF (NEW.value_token IS DISTINCT FROM OLD.value_token
        OR NEW.value IS DISTINCT FROM OLD.value) AND NEW.value_token = NEW.token THEN
        INSERT INTO pglease._history (name, token, event, holder, at, detail)
        VALUES (NEW.name, NEW.token, 'value', NEW.holder, clock_timestamp(), NEW.value);
    END IF;
    IF NEW.step_down_at IS DISTINCT FROM OLD.step_down_at AND NEW.step_down_token = NEW.token THEN
        INSERT INTO pglease._history (name, token, event, holder, at, detail)
        VALUES (NEW.name, NEW.token, 'step_down_requested', NEW.holder, NEW.step_down_at,
                NEW.step_down_by);
    END IF;
    -- Retention, now and then.
    IF new_id % 128 = 0 THEN
        -- The oldest rows by id (rows are recorded in about the order of
        -- their times), through the primary key: no index on time to keep.
        DELETE FROM pglease._history AS h
         WHERE h.id IN (SELECT o.id FROM pglease._history AS o ORDER BY o.id LIMIT 1000)
           AND h.at < clock_timestamp() - retention;
    END IF;
    RETURN NULL;
END
$$;

REVOKE ALL ON FUNCTION pglease._record() FROM PUBLIC;

CREATE TRIGGER pglease_record
AFTER UPDATE OF token, holder, value, value_token, step_down_at ON pglease.leases
FOR EACH ROW
WHEN (OLD.token IS DISTINCT FROM NEW.token
      OR OLD.holder IS DISTINCT FROM NEW.holder
      OR OLD.value IS DISTINCT FROM NEW.value
      OR OLD.value_token IS DISTINCT FROM NEW.value_token
      OR OLD.step_down_at IS DISTINCT FROM NEW.step_down_at)
EXECUTE FUNCTION pglease._record();

------------------------------------------------------------------------
-- force_release(name, reason): end a held lease at once, moving its fence.
------------------------------------------------------------------------

CREATE FUNCTION pglease.force_release(name text, reason text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    give_up    timestamptz := clock_timestamp() + interval '2 seconds';
    checked    text;
    cur_token  bigint;
    cur_holder text;
    cur_expiry timestamptz;
    cur_id     integer;
    note       text;
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
    LOOP
        -- FOR UPDATE: the fence (a key) moves. The holder's fenced
        -- transactions hold FOR KEY SHARE, which this waits for: they are
        -- ended below, since the token they declared is the one to end.
        SELECT l.token, l.holder, l.expires_at, l.id
          INTO cur_token, cur_holder, cur_expiry, cur_id
          FROM pglease.leases AS l WHERE l.name = force_release.name FOR UPDATE SKIP LOCKED;
        IF FOUND THEN
            IF cur_holder IS NULL OR clock_timestamp() >= cur_expiry THEN
                RETURN NULL; -- nobody holds it: nothing to break
            END IF;
            IF current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
                PERFORM set_config('synchronous_commit', 'on', true);
            END IF;
            PERFORM set_config('pglease.reason', force_release.reason, true);
            UPDATE pglease.leases AS l
               SET token = nextval('pglease.fence_seq'),
                   holder = NULL,
                   expires_at = clock_timestamp(),
                   released_at = clock_timestamp()
             WHERE l.name = force_release.name;
            PERFORM set_config('pglease.reason', '', true);
            -- Wake waiting acquirers at commit, as a release does (rare
            -- enough to notify whether or not anyone watches).
            PERFORM pg_notify('pglease_release', force_release.name);
            RETURN cur_token;
        END IF;
        SELECT l.holder, l.expires_at, l.id INTO cur_holder, cur_expiry, cur_id
          FROM pglease.leases AS l WHERE l.name = force_release.name;
        IF NOT FOUND OR cur_holder IS NULL OR clock_timestamp() >= cur_expiry THEN
            RETURN NULL;
        END IF;
        note := pglease._end_fenced(force_release.name, cur_id);
        IF note IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = '55P03',
                MESSAGE = format('pglease: cannot force lease %L: %s', force_release.name, note);
        END IF;
        IF clock_timestamp() >= give_up THEN
            RAISE EXCEPTION USING ERRCODE = '55P03',
                MESSAGE = format('pglease: cannot force lease %L: its row is still locked after '
                                 '2 s by a transaction that pglease cannot end (a prepared '
                                 'transaction, or a lock taken without pglease.assert_held)',
                                 force_release.name);
        END IF;
        PERFORM pg_sleep(0.002);
    END LOOP;
END
$$;

REVOKE ALL ON FUNCTION pglease.force_release(text, text) FROM PUBLIC;

COMMENT ON FUNCTION pglease.force_release(text, text) IS
    'Administrators only (not granted to PUBLIC): end lease NAME at once and move its '
    'fence, so that the holder''s token is stale from now on (its renewal fails, its '
    'fenced writes are rejected, its release is ignored), ending its open fenced '
    'transactions; recorded in pglease.history with REASON. Returns the token ended, or '
    'NULL if nobody held the lease.';
