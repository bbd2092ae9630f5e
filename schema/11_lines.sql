-- =====================================================================
-- 11. FIRST-COME-FIRST-SERVED WAITING: LINES
-- =====================================================================
--
-- Without a line, waiters race: each release wakes every waiter and the
-- quickest takes the lease, so under contention one waiter can lose every
-- round. An acquirer that wants to be served in turn joins the line of
-- its names with enqueue, which gives it a ticket (from one sequence, so
-- tickets order every line the same way: a set joins all its names' lines
-- with one ticket, and two sets can never each be first in one line and
-- wait on the other) and its position. It then acquires with the ticket
-- (acquire, acquire_all): the lease is granted only to the first live
-- place in line, and an acquisition without a ticket is refused while
-- anyone waits in line (nobody is overtaken; note and ahead say so).
--
-- A PLACE is held like a lease: each attempt with its ticket keeps it for
-- another TTL and moves it to the attempting session. It ends at once
-- when that session ends (the waiter's process or connection is gone:
-- the next attempt of anyone skips it), when its TTL passes without an
-- attempt (a frozen waiter holds up the line for at most one TTL, the
-- same bound as a frozen holder), when its acquisition succeeds, or with
-- dequeue. An attempt whose place has ended gets SQLSTATE LE003 and may
-- join again, at the end of the line. Only the role that joined (its
-- members, administrators) may act with a ticket.
--
-- THE FLAG leases.queued, set by enqueue and never cleared, tells an
-- acquisition to read the line: names nobody ever waited in line for pay
-- one column read. A join and a first acquisition of the same new name
-- take turns on its _creators slot, so the new row is marked either way.
--
-- THE LENGTH of a line is bounded: enqueue takes MAX_WAITING (at most
-- _max_waiting()) and answers a NULL ticket when that many wait already.
-- Counted leases have no line (their slots are names of their own).
-- =====================================================================

CREATE FUNCTION pglease._max_waiting()
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 1000 $$;

COMMENT ON FUNCTION pglease._max_waiting() IS
    'How many acquirers may wait in one line, at most.';

CREATE SEQUENCE pglease.line_seq AS bigint START WITH 1 NO CYCLE;

-- One row per place: a name and a ticket (a set has one row per name).
CREATE TABLE pglease._line (
    name          pglease.bounded_text NOT NULL,
    ticket        bigint      NOT NULL,
    holder        pglease.bounded_text NOT NULL,
    -- The login role that joined: only it may act with the ticket.
    role          name        NOT NULL,
    -- The session of the latest attempt: the place ends with it.
    session_pid   integer     NOT NULL,
    session_start timestamptz,
    joined_at     timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL,
    PRIMARY KEY (name, ticket)
);

REVOKE ALL ON pglease._line, pglease.line_seq FROM PUBLIC;

-- Whether PLACE still waits: its TTL has not passed and its session
-- lives. The one statement of a live place (the view line, the counts of
-- who is ahead, the place a handover takes). Inlined where it is called.
CREATE FUNCTION pglease._place_lives(place pglease._line)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT $1.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()
       AND NOT pglease._session_gone($1.session_pid, $1.session_start)
$$;

-- Result of enqueue: the ticket (NULL: the line is full), the position
-- (1: first in line; for a set, its furthest from the front) and how
-- many wait in the longest of its lines, itself included.
CREATE TYPE pglease.place AS (
    ticket   bigint,
    position integer,
    waiting  integer
);

-- Ends the places in NAME's line whose session has ended or whose TTL has
-- passed; with TICKET, keeps that place for another TTL on this session
-- (LE003 if it has ended, 42501 if it is another role's). Returns how
-- many live places come before TICKET (before everyone, without one);
-- -1 when TICKET's place ended because the lease was handed over to it
-- (see HANDOVER) after the caller read the lease's row.
CREATE FUNCTION pglease._ahead(name text, ticket bigint, ttl interval)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    owner name;
    n     integer;
BEGIN
    -- Places past their TTL go. A place whose session has ended is
    -- skipped (not counted) but kept until its TTL: its waiter, back with
    -- its ticket on another connection (a pool closes idle ones), takes
    -- it up again; a waiter that died never comes back.
    DELETE FROM pglease._line AS q
     WHERE q.name = _ahead.name AND q.expires_at <= clock_timestamp();
    IF _ahead.ticket IS NOT NULL THEN
        SELECT q.role INTO owner FROM pglease._line AS q
         WHERE q.name = _ahead.name AND q.ticket = _ahead.ticket;
        IF NOT FOUND THEN
            -- Committed with the place's end, so seen with it.
            IF EXISTS (SELECT 1 FROM pglease.leases AS l
                        WHERE l.name = _ahead.name AND l.handed_to = _ahead.ticket) THEN
                RETURN -1;
            END IF;
            RAISE EXCEPTION USING ERRCODE = 'LE003',
                MESSAGE = format('pglease: ticket %s has no place in the line for %L', _ahead.ticket,
                                 _ahead.name),
                DETAIL = 'The place was taken, left, or ended: no attempt kept it within its '
                         'TTL.',
                HINT = 'Join the line again (pglease.enqueue).';
        END IF;
        IF NOT pglease._may_act(owner) THEN
            RAISE EXCEPTION USING ERRCODE = '42501',
                MESSAGE = format('pglease: role %I may not wait with ticket %s in the line for %L: '
                                 'role %I joined it', session_user, _ahead.ticket, _ahead.name,
                                 owner);
        END IF;
        UPDATE pglease._line AS q
           SET expires_at = clock_timestamp()
                            + make_interval(secs => extract(epoch FROM _ahead.ttl)::double precision),
               session_pid = pg_backend_pid(),
               session_start = (SELECT a.backend_start FROM pg_stat_get_activity(pg_backend_pid()) AS a)
         WHERE q.name = _ahead.name AND q.ticket = _ahead.ticket;
    END IF;
    SELECT count(*) INTO n FROM pglease._line AS q
     WHERE q.name = _ahead.name AND (_ahead.ticket IS NULL OR q.ticket < _ahead.ticket)
       AND pglease._place_lives(q);
    RETURN n;
END
$$;

REVOKE ALL ON FUNCTION pglease._ahead(text, bigint, interval) FROM PUBLIC;

CREATE FUNCTION pglease.enqueue(names text[], holder text, ttl interval,
                                max_waiting integer DEFAULT NULL)
RETURNS pglease.place
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    sorted  text[];
    n       text;
    bound   integer := coalesce(enqueue.max_waiting, pglease._max_waiting());
    longest integer := 0;
    before  integer := 0;
    mine    bigint;
    checked text;
BEGIN
    sorted := pglease._check_names(enqueue.names, 'wait for');
    checked := pglease._check_text('holder', enqueue.holder);
    PERFORM pglease._check_ttl(enqueue.ttl);
    IF bound NOT BETWEEN 1 AND pglease._max_waiting() THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'max_waiting',
            MESSAGE = format('pglease: max_waiting must be between 1 and %s, got %s',
                             pglease._max_waiting(), bound);
    END IF;
    IF pg_is_in_recovery() THEN
        PERFORM pglease._refuse_standby('join a line');
    END IF;
    FOREACH n IN ARRAY sorted LOOP
        longest := greatest(longest, pglease._ahead(n, NULL, enqueue.ttl));
    END LOOP;
    IF longest >= bound THEN
        RETURN ROW(NULL, NULL, longest)::pglease.place;
    END IF;
    -- A name being acquired for the first time: wait for its creator to
    -- commit (its row is then marked below), or keep it from creating the
    -- row until this place is committed (it then marks the row itself).
    PERFORM 1 FROM pglease._creators AS c
     WHERE c.slot IN (SELECT hashtext(u.n) & 255 FROM unnest(sorted) AS u(n))
       FOR SHARE;
    -- Acquisitions read the line of a marked name (a name never acquired
    -- has no row: its first acquisition reads the line anyway). Marked
    -- before the place is made: this may wait for a transaction holding
    -- the row, and the place's TTL starts only once nothing is waited for.
    UPDATE pglease.leases AS l SET queued = true
     WHERE l.name = ANY (sorted) AND NOT l.queued;
    mine := nextval('pglease.line_seq');
    INSERT INTO pglease._line AS q (name, ticket, holder, role, session_pid, session_start,
                                    joined_at, expires_at)
    SELECT u.n, mine, enqueue.holder, session_user, pg_backend_pid(),
           (SELECT a.backend_start FROM pg_stat_get_activity(pg_backend_pid()) AS a),
           clock_timestamp(),
           clock_timestamp() + make_interval(secs => extract(epoch FROM enqueue.ttl)::double precision)
      FROM unnest(sorted) AS u(n);
    SELECT coalesce(max(c.k), 0) INTO before
      FROM (SELECT count(*) AS k FROM pglease._line AS q
             WHERE q.name = ANY (sorted) AND q.ticket < mine AND pglease._place_lives(q)
             GROUP BY q.name) AS c;
    -- Its own place counts even if a TTL shorter than this statement
    -- has already ended it (its next attempt is then told so, LE003).
    SELECT max(c.k) INTO longest
      FROM (SELECT count(*) AS k FROM pglease._line AS q
             WHERE q.name = ANY (sorted) AND (q.ticket = mine OR pglease._place_lives(q))
             GROUP BY q.name) AS c;
    RETURN ROW(mine, before + 1, longest)::pglease.place;
END
$$;

COMMENT ON FUNCTION pglease.enqueue(text[], text, interval, integer) IS
    'Join the line of every name of NAMES (1 to 100 distinct names; 42501 before anything '
    'if the caller may not use one) as HOLDER, first come first served: acquire (or '
    'acquire_all) with the ticket grants the lease only to the first live place in line, '
    'and refuses acquisitions without one while anyone waits. The place ends with this '
    'session, or unless an attempt with the ticket keeps it within TTL. Returns (ticket, '
    'position, waiting); ticket is NULL if MAX_WAITING (default and at most 1000) wait '
    'already in one of the lines.';

CREATE FUNCTION pglease.dequeue(ticket bigint)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    owner name;
    n     integer;
BEGIN
    IF dequeue.ticket IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'ticket',
            MESSAGE = 'pglease: ticket must not be NULL';
    END IF;
    SELECT q.role INTO owner FROM pglease._line AS q WHERE q.ticket = dequeue.ticket LIMIT 1;
    IF FOUND AND NOT pglease._may_act(owner) THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('pglease: role %I may not leave the line for ticket %s: role %I '
                             'joined it', session_user, dequeue.ticket, owner);
    END IF;
    DELETE FROM pglease._line AS q WHERE q.ticket = dequeue.ticket;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

COMMENT ON FUNCTION pglease.dequeue(bigint) IS
    'Leave the line: end every place of TICKET (42501 if another role joined with it). '
    'Returns how many places ended (0: none was left).';

-- Every line, as it stands: the places whose session lives and whose TTL
-- has not passed, numbered from the front of each line.
CREATE VIEW pglease.line AS
SELECT q.name,
       q.ticket,
       q.holder,
       row_number() OVER (PARTITION BY q.name ORDER BY q.ticket)::integer AS position,
       q.joined_at,
       q.expires_at,
       q.session_pid AS waiter_session
  FROM pglease._line AS q
 WHERE pglease._place_lives(q);

REVOKE ALL ON pglease.line FROM PUBLIC;

COMMENT ON VIEW pglease.line IS
    'Who waits in line for each lease, first come first served: name, ticket, holder, '
    'position (1: next), joined_at, expires_at (the place ends then unless its waiter tries '
    'again), waiter_session.';

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pglease_admin') THEN
        GRANT SELECT ON pglease.line TO pglease_admin;
    END IF;
END
$$;

-- Per name: an administrator makes every waiter for NAME wait in line
-- (FAIR true), as if each asked for it; false undoes it. Acquire's
-- refusals then answer fair = true, and the library's waiter joins the
-- line. It changes who is served next, never who may hold: administrators
-- only, like name grants.
CREATE FUNCTION pglease.set_fair(name text, fair boolean)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked text;
    note    text;
BEGIN
    checked := pglease._check_text('name', set_fair.name);
    IF set_fair.fair IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'fair',
            MESSAGE = 'pglease: fair must be true or false, got NULL';
    END IF;
    IF NOT pglease.is_admin() THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('pglease: role %I may not set how lease %L is waited for: pglease '
                             'administrators only', session_user, set_fair.name);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pglease.leases AS l WHERE l.name = set_fair.name) THEN
        note := pglease._create(set_fair.name);
        IF note IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = '55P03',
                MESSAGE = format('pglease: cannot set lease %L: %s', set_fair.name, note);
        END IF;
    END IF;
    UPDATE pglease.leases AS l SET fair = set_fair.fair WHERE l.name = set_fair.name;
END
$$;

REVOKE ALL ON FUNCTION pglease.set_fair(text, boolean) FROM PUBLIC;

COMMENT ON FUNCTION pglease.set_fair(text, boolean) IS
    'Administrators only: with FAIR true every waiter for lease NAME waits in line (first '
    'come, first served; acquire''s refusals answer fair = true); false undoes it.';

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pglease_admin') THEN
        GRANT EXECUTE ON FUNCTION pglease.set_fair(text, boolean) TO pglease_admin;
    END IF;
END
$$;
