-- =====================================================================
-- 4. TIMELINES: A SERVER THAT FORGOT COMMITS
--
-- A server that was promoted (a failover to an asynchronous standby) or
-- that recovered from a backup continues on a new timeline, and may have
-- forgotten the old primary's latest commits: acquisitions, releases,
-- renewals, and the fence sequence's latest values. Left alone it would
-- draw again tokens that the old primary had handed out, and a stale
-- holder's guarded write under such a token would pass as the new
-- holder's.
--
-- FINDING THE CHANGE. Before it draws a token, acquire (and force_release,
-- and admit before it judges one) needs the row of pglease._checked, an
-- unlogged table that PostgreSQL empties in crash recovery and at the end
-- of archive recovery, and that no base backup holds. The first of them
-- after such a start makes the check (_timeline_checked): it reads the
-- server's timeline (server_timeline) and compares it with the latest row
-- of pglease._timelines. The same timeline: a crash restart, which loses
-- no durable commit (see DURABILITY): only the marker is written again. A
-- different one: a change. acquire's statement takes nothing while the
-- marker is missing (one test of a one-row table per statement), so the
-- hot path pays no more than that.
--
-- MOVING THE FENCE. On a change, the fence sequence moves from the highest
-- value this server can have drawn (seen: the sequence as it found it,
-- which PostgreSQL logs up to 32 values ahead of the last one drawn) to
-- seen + 2^40 (the floor; _timeline_margin says why that cannot be used up
-- in practice), before any token is drawn on the new timeline. The change
-- is recorded in pglease._timelines (view pglease.timelines) and in the
-- history, as an event of the whole server that every lease's history
-- shows. Tokens stay one bigint, strictly increasing per name. It all
-- happens in the transaction of the call that found the change, made
-- durable with it; checks take turns on the row of
-- pglease._timeline_config, waiting for at most 1 s (bounded, like every
-- wait here: an acquisition then answers "not acquired" with a note).
--
-- WHAT THE NEW SERVER KNOWS. Leases whose acquisition reached it go on:
-- their holders renew, write and release as before. A token drawn before
-- a change that this server does not know for its lease (above the row's
-- token, or for a name it has no row for, or, once the name was acquired
-- again after the change, above seen) is refused like any stale token,
-- with a reason of its own: assert_held's LE001 says reason=forgotten and
-- the timeline, renew_many says forgotten_in, and forgotten_in(name,
-- token) says it for renew, release and set_value, which answer only NULL
-- or false. What cannot be told apart: a lost token among the 32 values
-- logged ahead, or one whose transaction was overtaken in the WAL by a
-- later token's, on a name acquired again since, reads as stale. Either
-- way it is refused.
--
-- HIGH-WATER MARKS. pglease.fences may have lost marks too. After a change,
-- admit accepts a token drawn before it only while that token's lease,
-- valid when the change was found (pglease._carried), is still held under
-- it: a stale holder whose successor's admission the server forgot cannot
-- slip in under a mark that went back. Tokens drawn after the change are
-- above every old one. A resource that keeps its own mark needs nothing.
--
-- THE GRANT DELAY (opt-in, Chubby's lock-delay). A holder whose
-- acquisition was lost may still act outside the database (side effects
-- no fence checks) until its own lease would have ended. An administrator
-- may set a delay (set_grant_delay): for that long after a change,
-- acquire answers "not acquired", with delayed_until and a note, for
-- every name. No acquisition can be proven safe in that time: a release
-- or force release that the old primary acknowledged and this server lost
-- may have let anyone take any name there. Renewals, releases and fenced
-- writes of the leases this server knows go on. Guarded writes and
-- high-water marks are safe without it; where unfenced side effects
-- matter, make it at least the longest TTL in use.
--
-- A ROLLBACK WITHOUT A NEW TIMELINE (a file-system snapshot, a base backup
-- started without recovery.signal) looks like a crash restart to the
-- server. An administrator declares it with pglease.restored(reason),
-- which moves the fence as a change of timeline does.
-- =====================================================================

-- LATER PARTS. Used here, defined in a later part (PL/pgSQL looks a
-- name up when a function runs, not when it is created): 7: _record.

-- Raises 25006 on a standby, where nothing can be written: before
-- anything reads pglease._checked, which a standby cannot read (unlogged).
CREATE FUNCTION pglease._refuse_standby(action text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = '25006',
        MESSAGE = format('pglease: cannot %s on a standby: the server is in recovery (read-only)',
                         action);
END
$$;

-- The server's timeline: the first eight hex digits of the name of the
-- WAL file being written (pg_control_checkpoint() still says the old one
-- until the first checkpoint after a promotion). Fails on a standby
-- (recovery is in progress), where nothing draws tokens.
CREATE FUNCTION pglease.server_timeline()
RETURNS bigint
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT ('x' || lpad(substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8), 16, '0'))
           ::bit(64)::bigint
$$;

COMMENT ON FUNCTION pglease.server_timeline() IS
    'The timeline this server writes WAL on, as pglease reads it (an error on a standby).';

-- The change of timeline in which this server forgot an acquisition under
-- TOKEN of a lease whose row has token CURRENT (NULL: it has no row), or
-- NULL (every column) if it did not (see WHAT THE NEW SERVER KNOWS): the
-- first change after TOKEN was drawn, if the server does not know TOKEN
-- for that lease. Also a change not checked yet (a renewal or a guarded
-- write can come before any acquisition on the new timeline): no token has
-- been drawn since, so TOKEN is from before it; that row has no id, at or
-- floor. It only reads: a refusal must not move the fence (its
-- transaction may roll back, and setval would not). Callers ask only for
-- a token that is not the row's.
CREATE FUNCTION pglease._forgotten(token bigint, current bigint)
RETURNS pglease._timelines
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    change pglease._timelines;
    tli    bigint;
BEGIN
    SELECT c.* INTO change FROM pglease._timelines AS c
     WHERE c.cause <> 'migrated' AND _forgotten.token <= c.floor
       AND (_forgotten.current IS NULL OR _forgotten.current = 0
            OR _forgotten.token > _forgotten.current
            OR (_forgotten.current > c.floor AND _forgotten.token > c.seen))
     ORDER BY c.floor
     LIMIT 1;
    IF FOUND THEN
        RETURN change;
    END IF;
    IF (_forgotten.current IS NULL OR _forgotten.current = 0
        OR _forgotten.token > _forgotten.current)
       AND NOT pg_is_in_recovery() AND NOT EXISTS (SELECT 1 FROM pglease._checked) THEN
        tli := pglease.server_timeline();
        SELECT c.* INTO change FROM pglease._timelines AS c ORDER BY c.id DESC LIMIT 1;
        IF change.timeline IS DISTINCT FROM tli THEN
            RETURN ROW(NULL, tli, change.timeline, NULL, NULL, NULL, NULL, 'timeline')
                   ::pglease._timelines;
        END IF;
    END IF;
    RETURN NULL;
END
$$;

REVOKE ALL ON FUNCTION pglease._forgotten(bigint, bigint) FROM PUBLIC;

CREATE FUNCTION pglease.forgotten_in(name text, token bigint)
RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked text;
    cur     bigint;
BEGIN
    checked := pglease._check_text('name', forgotten_in.name);
    PERFORM pglease._check_token(forgotten_in.token);
    SELECT l.token INTO cur FROM pglease.leases AS l WHERE l.name = forgotten_in.name;
    IF cur IS NOT DISTINCT FROM forgotten_in.token THEN
        RETURN NULL;
    END IF;
    RETURN (pglease._forgotten(forgotten_in.token, cur)).timeline;
END
$$;

COMMENT ON FUNCTION pglease.forgotten_in(text, bigint) IS
    'The timeline whose change (a failover or a restore) made this server forget the '
    'acquisition of lease NAME under TOKEN, or NULL if it did not: why a renewal, release '
    'or set_value under that token changed nothing.';

-- This server's row of pglease._checked, made first if it is missing (see
-- FINDING THE CHANGE and MOVING THE FENCE). With DECLARED (a reason, from
-- pglease.restored), a change whatever the timeline. Every column NULL
-- when another transaction's check has not committed within 1 s. Runs in
-- its caller's transaction, as the owner of the functions.
CREATE FUNCTION pglease._timeline_checked(declared text)
RETURNS pglease._checked
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    give_up   timestamptz := clock_timestamp() + interval '1 second';
    here      pglease._checked;
    last      pglease._timelines;
    tli       bigint;
    seen      bigint;
    new_floor bigint;
    delay     interval;
    t         timestamptz;
    detail    text;
BEGIN
    LOOP
        SELECT c.grant_delay INTO delay FROM pglease._timeline_config AS c FOR UPDATE SKIP LOCKED;
        EXIT WHEN FOUND;
        IF clock_timestamp() >= give_up THEN
            RETURN NULL;
        END IF;
        PERFORM pg_sleep(0.002);
    END LOOP;
    -- Another check may have committed while this one waited.
    SELECT * INTO here FROM pglease._checked;
    IF FOUND AND declared IS NULL THEN
        RETURN here;
    END IF;
    tli := pglease.server_timeline();
    SELECT * INTO last FROM pglease._timelines AS c ORDER BY c.id DESC LIMIT 1;
    IF last.timeline = tli AND declared IS NULL THEN
        -- The same timeline: a crash restart, which lost no durable commit.
        INSERT INTO pglease._checked AS c (timeline, floor, grant_after)
        VALUES (tli, last.floor, last.grant_after)
        RETURNING * INTO here;
        RETURN here;
    END IF;

    -- A change (or a declared rollback): move the fence before any token
    -- is drawn after it.
    SELECT CASE WHEN q.is_called THEN q.last_value ELSE q.last_value - 1 END INTO seen
      FROM pglease.fence_seq AS q;
    IF seen > 9223372036854775807 - pglease._timeline_margin() THEN
        RAISE EXCEPTION USING ERRCODE = '2200H',
            MESSAGE = format('pglease: the fence sequence (at %s) has no room left to move past '
                             'the tokens of timeline %s', seen, last.timeline);
    END IF;
    new_floor := seen + pglease._timeline_margin();
    PERFORM setval('pglease.fence_seq', new_floor, true);
    t := clock_timestamp();
    INSERT INTO pglease._timelines AS c (timeline, previous, seen, floor, at, grant_after, cause)
    VALUES (tli, last.timeline, seen, new_floor, t,
            CASE WHEN delay > interval '0' THEN t + delay END, coalesce(declared, 'timeline'))
    RETURNING * INTO last;
    DELETE FROM pglease._carried;
    INSERT INTO pglease._carried (token, name)
    SELECT l.token, l.name FROM pglease.leases AS l
     WHERE l.holder IS NOT NULL AND t < l.expires_at AND l.token > 0;
    detail := format('%s: tokens continue above %s; those drawn before it above %s '
                     'are unknown here%s',
                                   CASE WHEN declared IS NULL
                                        THEN format('timeline %s -> %s (a failover or a restore)',
                                                    last.previous, tli)
                                        ELSE format('rollback declared on timeline %s (%s)', tli,
                                                    declared) END,
                                   new_floor, seen,
                                   CASE WHEN last.grant_after IS NOT NULL
                                        THEN format('; no lease granted until %s', last.grant_after)
                                        ELSE '' END);
    PERFORM pglease._record(NULL, new_floor, 'timeline', NULL, t, NULL, detail);
    -- The new floor must be on disk before any token above it is used.
    PERFORM pglease._durable();
    INSERT INTO pglease._checked AS c (timeline, floor, grant_after)
    VALUES (tli, new_floor, last.grant_after)
    ON CONFLICT ON CONSTRAINT _checked_pkey DO UPDATE
        SET timeline = excluded.timeline, floor = excluded.floor, grant_after = excluded.grant_after
    RETURNING * INTO here;
    RAISE LOG 'pglease: %', detail;
    RETURN here;
END
$$;

REVOKE ALL ON FUNCTION pglease._timeline_checked(text) FROM PUBLIC;

-- The timeline the schema was made on: the first row.
INSERT INTO pglease._timelines (timeline, previous, seen, floor, at, cause)
VALUES (pglease.server_timeline(), NULL, 0, 0, clock_timestamp(), 'migrated');

-- Whether a lease may be granted now (a token drawn for a new term):
-- WHY is NULL if so; else why not, worded for a refusal, with
-- DELAYED_UNTIL the end of the grant delay (NULL while another
-- transaction's timeline check has not committed). Checks this server's
-- timeline first if it has not been. CALL names the function called, for
-- the advice to call it in a transaction of its own. The one wording of
-- these refusals.
CREATE FUNCTION pglease._no_grant_now(call text, OUT why text, OUT delayed_until timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    here pglease._checked;
BEGIN
    SELECT * INTO here FROM pglease._checked;
    IF NOT FOUND THEN
        here := pglease._timeline_checked(NULL);
        IF here.timeline IS NULL THEN
            why := format('another transaction checking the server''s timeline has not '
                          'committed for 1 s (call %s in a transaction of its own)', call);
            RETURN;
        END IF;
    END IF;
    IF here.grant_after > clock_timestamp() THEN
        why := format('the database changed to timeline %s (a failover or a restore) and '
                      'grants no lease until %s (the grant delay, pglease.set_grant_delay): an '
                      'acquisition lost with the old timeline may still be in use; renewals of '
                      'the leases this server knows go on', here.timeline, here.grant_after);
        delayed_until := here.grant_after;
    END IF;
END
$$;

REVOKE ALL ON FUNCTION pglease._no_grant_now(text) FROM PUBLIC;

CREATE VIEW pglease.timelines AS
SELECT c.timeline, c.previous, c.seen, c.floor, c.at, c.grant_after, c.cause
  FROM pglease._timelines AS c
 ORDER BY c.id;

COMMENT ON VIEW pglease.timelines IS
    'The timelines this database has drawn tokens on, oldest first by at: the one the schema '
    'was made on (cause migrated), then each change found (cause timeline: a failover or a '
    'restore) or rollback declared (the reason given to pglease.restored). Tokens drawn after '
    'a change are above floor; seen is the highest the server could have drawn before it; '
    'grant_after, the end of the grant delay.';

CREATE FUNCTION pglease.restored(reason text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    here pglease._checked;
BEGIN
    IF restored.reason IS NULL OR octet_length(restored.reason) NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'reason',
            MESSAGE = format('pglease: reason must be 1 to 1000 bytes: say what was restored, got %s',
                             coalesce(octet_length(restored.reason)::text || ' bytes', 'NULL'));
    END IF;
    IF NOT pglease.is_admin() THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('pglease: role %I may not declare a restore: pglease administrators '
                             'only', session_user);
    END IF;
    here := pglease._timeline_checked(restored.reason);
    IF here.timeline IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '55P03',
            MESSAGE = 'pglease: another transaction checking the server''s timeline has not '
                      'committed for 1 s; try again';
    END IF;
    RETURN here.floor;
END
$$;

REVOKE ALL ON FUNCTION pglease.restored(text) FROM PUBLIC;

COMMENT ON FUNCTION pglease.restored(text) IS
    'Administrators only: declare that this database was rolled back to an earlier state '
    'without a new timeline (a file-system snapshot, a base backup started without '
    'recovery.signal): moves the fence as a change of timeline does (see pglease.timelines). '
    'Returns the floor tokens now continue above.';

CREATE FUNCTION pglease.set_grant_delay(delay interval)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    latest pglease._timelines;
BEGIN
    IF NOT pglease.is_admin() THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('pglease: role %I may not set the grant delay: pglease '
                             'administrators only', session_user);
    END IF;
    IF set_grant_delay.delay IS NULL OR set_grant_delay.delay < interval '0'
       OR extract(epoch FROM set_grant_delay.delay) > pglease._max_ttl_seconds() THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'delay',
            MESSAGE = format('pglease: delay must be between 0 and the longest TTL (%s), got %s',
                             justify_hours(make_interval(secs => pglease._max_ttl_seconds())),
                             coalesce(set_grant_delay.delay::text, 'NULL'));
    END IF;
    UPDATE pglease._timeline_config AS c SET grant_delay = set_grant_delay.delay;
    -- A delay under way follows the setting: '0' ends it, a longer one
    -- lengthens it (counted from the change).
    UPDATE pglease._timelines AS c
       SET grant_after = CASE WHEN set_grant_delay.delay > interval '0'
                              THEN c.at + set_grant_delay.delay END
     WHERE c.id = (SELECT max(m.id) FROM pglease._timelines AS m) AND c.cause <> 'migrated'
    RETURNING * INTO latest;
    IF FOUND THEN
        UPDATE pglease._checked AS k SET grant_after = latest.grant_after;
    END IF;
END
$$;

REVOKE ALL ON FUNCTION pglease.set_grant_delay(interval) FROM PUBLIC;

COMMENT ON FUNCTION pglease.set_grant_delay(interval) IS
    'Administrators only: after a change of timeline (a failover or a restore), grant no lease '
    'for DELAY (0, the default: none; at most 7 days), so that holders whose acquisition the '
    'change lost have stopped their unfenced side effects. Applies to a delay under way.';

CREATE VIEW pglease.grant_delay AS
SELECT c.grant_delay AS delay FROM pglease._timeline_config AS c;

COMMENT ON VIEW pglease.grant_delay IS
    'The grant delay after a change of timeline (pglease.set_grant_delay).';
