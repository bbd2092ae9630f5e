-- =====================================================================
-- 1. LIMITS, TABLES, INPUT CHECKS AND AUTHORITY
--
-- What every later part relies on: the bounds on inputs, the tables and
-- the types the functions return, the input checks and authority tests
-- the functions share (the status view, which reads the tables of every
-- kind of holder, is part 14).
-- =====================================================================

------------------------------------------------------------------------
-- Limits, named once. They are inlined and folded to constants wherever
-- they are used, so they cost nothing per call.
------------------------------------------------------------------------

-- name, holder and admit's resource: 1 to this many bytes of UTF-8.
CREATE FUNCTION pglease._max_text_bytes()
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 255 $$;

-- ttl: greater than zero and at most this many seconds (7 days).
CREATE FUNCTION pglease._max_ttl_seconds()
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 604800 $$;

-- value: at most this many bytes of UTF-8 (8 KiB).
CREATE FUNCTION pglease._max_value_bytes()
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 8192 $$;

-- How far the fence sequence moves past the last token a server knew of
-- when it finds itself on a new timeline (see TIMELINES): 2^40. An old
-- primary would have to draw that many tokens after the last one its
-- standby received to reach it: about 127 days at 100,000 a second, while
-- every acquisition is a durable commit (a few thousand a second here).
-- 2^63 leaves room for 8 million such moves (2^53, the largest integer a
-- JavaScript number holds exactly, for 8,192).
CREATE FUNCTION pglease._timeline_margin()
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 1099511627776::bigint $$;

-- The most slots one counted lease may have.
CREATE FUNCTION pglease._max_slots()
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 1000 $$;

-- DURABILITY (see the rules), written once: this transaction commits with
-- synchronous_commit at least 'on', whatever the server or the session
-- set. Inlined where it is called, as the limits are: built-ins only,
-- schema-qualified, no SET clause. Answers the new setting, or NULL if it
-- was already so.
CREATE FUNCTION pglease._durable()
RETURNS text
LANGUAGE sql VOLATILE
AS $$
    SELECT CASE WHEN pg_catalog.current_setting('synchronous_commit')
                     NOT IN ('on', 'remote_apply')
                THEN pg_catalog.set_config('synchronous_commit', 'on', true) END
$$;

REVOKE ALL ON FUNCTION pglease._durable() FROM PUBLIC;

------------------------------------------------------------------------
-- Tables
------------------------------------------------------------------------

-- Tokens for every lease come from one sequence: strictly increasing in the
-- order they are drawn, never reused. CACHE 1 so that no session keeps a
-- private block of values; NO CYCLE so that it can never wrap around.
CREATE SEQUENCE pglease.fence_seq AS bigint START WITH 1 INCREMENT BY 1 CACHE 1 NO CYCLE;

-- Each lease's own number (bigint: a rolled-back first acquisition uses
-- one up, and nobody can exhaust 2^63 of them).
CREATE SEQUENCE pglease.lease_id_seq AS bigint START WITH 1 NO CYCLE;

-- The bounds of a name or holder, and of a value, as domains rather than
-- CHECK constraints on the table: PostgreSQL prepares a table's CHECK
-- constraints again for every statement that writes the table (in
-- pglease's functions: every call), which cost about a third of a renew;
-- a domain's check is planned with the statement and runs only on the
-- columns a statement assigns. The functions check their arguments
-- first, for the exact message; these are what the table guarantees.
CREATE DOMAIN pglease.bounded_text AS text
    CHECK (octet_length(VALUE) BETWEEN 1 AND pglease._max_text_bytes());
CREATE DOMAIN pglease.value_text AS text
    CHECK (octet_length(VALUE) <= pglease._max_value_bytes());
CREATE DOMAIN pglease.history_event AS text
    CHECK (VALUE IN ('acquired', 'released', 'expired', 'evicted', 'force_released', 'value',
                     'step_down_requested', 'timeline'));

-- One row per lease name, created on the first acquisition and never
-- deleted: deleting and recreating a row could let a racing acquirer lock a
-- row that is no longer current.
CREATE TABLE pglease.leases (
    name        pglease.bounded_text NOT NULL PRIMARY KEY,
    -- NULL once released; after expiry it still names the last holder.
    holder      pglease.bounded_text,
    -- The latest token issued for this name (0 only inside the transaction
    -- that creates the row).
    token       bigint      NOT NULL,
    expires_at  timestamptz NOT NULL,
    acquired_at timestamptz NOT NULL,
    renewed_at  timestamptz,
    released_at timestamptz,
    -- Unique by construction (only the functions write the table, and rows
    -- are never deleted), and deliberately not indexed: an index on a
    -- column no update changes would still be one more index to check,
    -- and nothing looks a lease up by its number.
    id          bigint      NOT NULL DEFAULT nextval('pglease.lease_id_seq'),
    -- The login role (session_user) of the latest acquisition: the role
    -- that may act under its token (see AUTHORITY at the top).
    role        name,
    -- The secret from which fenced transactions derive their marker (see
    -- assert_held); never shown outside pglease.
    secret      bytea       NOT NULL DEFAULT uuid_send(gen_random_uuid()),
    -- The value the holder of token value_token published (set_value). It
    -- belongs to that acquisition: the next one starts without it, at no
    -- cost to an acquisition that sets none.
    value       pglease.value_text,
    value_token bigint,
    -- How many times the holder of value_token has published a value (the
    -- history records the first 16 of a term, see HISTORY).
    value_changes integer   NOT NULL DEFAULT 0,
    -- Who asked the holder of token step_down_token to step down
    -- (request_step_down), and when; like a value, it belongs to that
    -- acquisition.
    step_down_token bigint,
    step_down_by    text,
    step_down_at    timestamptz,
    -- How many times the current acquisition has been renewed (counted by
    -- renew itself; recorded with the term's end).
    renewals    integer     NOT NULL DEFAULT 0,
    -- A session-bound acquisition (see SESSION-BOUND LEASES): the server
    -- session that made it, by process id and, where the role that owns
    -- the functions may read it, start time. NULL: bound to no session.
    session_pid   integer,
    session_start timestamptz,
    -- Whether acquirers have ever waited in line for this name (see
    -- LINES): set when one joins, never cleared (clearing it could race
    -- with a join not yet committed). An acquisition reads the line only
    -- when it is set.
    queued        boolean     NOT NULL DEFAULT false,
    -- Shared holders (see SHARED LEASES): the latest expiry of a valid
    -- one, or NULL (never understated: kept under this row's lock by
    -- every change of a shared holder); the exclusive term after which
    -- shared holders were admitted (its stale fenced transactions ended);
    -- and the exclusive acquirer that waits for them, until when new
    -- shared acquisitions wait behind it.
    readers_until      timestamptz,
    readers_after      bigint,
    writer_waiting     text,
    writer_waits_until timestamptz,
    -- The place in line (its ticket) this term was handed over to (see
    -- HANDOVER): an attempt with that ticket is answered the term.
    handed_to          bigint,
    -- Every waiter for this name waits in line (set_fair; see LINES).
    fair               boolean     NOT NULL DEFAULT false
    -- The primary key is the table's only index, and no function changes
    -- the name: every update is a HOT update (see LOCKS above for why the
    -- token needs no index).
) WITH (fillfactor = 80); -- room for the HOT updates

ALTER SEQUENCE pglease.lease_id_seq OWNED BY pglease.leases.id;

COMMENT ON TABLE pglease.leases IS
    'One row per lease name; change it only through the pglease functions.';

COMMENT ON COLUMN pglease.leases.role IS
    'The login role (session_user) of the latest acquisition: only it, its members and '
    'administrators may act under the lease''s token.';

-- Separate-resource fencing: the highest token each resource has accepted.
CREATE TABLE pglease.fences (
    resource    pglease.bounded_text NOT NULL PRIMARY KEY,
    token       bigint      NOT NULL,
    advanced_at timestamptz NOT NULL
);

COMMENT ON TABLE pglease.fences IS
    'High-water mark of accepted tokens per separate resource (pglease.admit).';

-- Every transition of every lease (see HISTORY below), read through the
-- view pglease.history.
CREATE TABLE pglease._history (
    id     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- NULL for an event of the whole server (a timeline change), which
    -- every lease's history shows.
    name   text,
    token  bigint      NOT NULL,
    event  pglease.history_event NOT NULL,
    holder text,
    at     timestamptz NOT NULL,
    renewals integer,
    detail text,
    -- The login role (session_user) whose call recorded the transition.
    role   name
);

CREATE INDEX _history_name ON pglease._history (name, id);

-- The history's bounds, set by an administrator (pglease.set_history):
-- one row. Not a setting: a session could SET one.
CREATE TABLE pglease._history_config (
    one        boolean  NOT NULL PRIMARY KEY DEFAULT true CHECK (one),
    -- Rows older than this are deleted; '0' records nothing.
    retention  interval NOT NULL DEFAULT interval '30 days',
    -- And the oldest rows beyond this many.
    max_rows   bigint   NOT NULL DEFAULT 1000000 CHECK (max_rows >= 1000)
);
INSERT INTO pglease._history_config DEFAULT VALUES;

-- Names granted to roles by prefix (pglease.grant_names); see AUTHORITY.
CREATE TABLE pglease.name_grants (
    prefix     text NOT NULL CHECK (octet_length(prefix) BETWEEN 1 AND pglease._max_text_bytes()),
    role       name NOT NULL,
    granted_by name NOT NULL,
    granted_at timestamptz NOT NULL,
    PRIMARY KEY (prefix, role)
);

COMMENT ON TABLE pglease.name_grants IS
    'Lease names granted to roles by prefix (pglease.grant_names): a name under a '
    'granted prefix may be acquired only by members of a role granted a prefix of it, '
    'or administrators.';

-- Which lease protects which table (pglease.protect): the guard reads its
-- lease here, never from its trigger's arguments.
CREATE TABLE pglease._protected (
    tbl          oid         NOT NULL PRIMARY KEY,
    name         text        NOT NULL,
    protected_by name        NOT NULL,
    protected_at timestamptz NOT NULL
);

-- Every timeline this database has drawn tokens on (see TIMELINES): the
-- first row is the one the migration ran on; each later one records a
-- change of timeline (a promotion, a restore that ended on a new
-- timeline) or a rollback an administrator declared (pglease.restored).
CREATE TABLE pglease._timelines (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The server's timeline from then on.
    timeline    bigint      NOT NULL,
    -- The timeline recorded before (NULL: the first row).
    previous    bigint,
    -- The highest token this server could have drawn before the change:
    -- the fence sequence's value as the server found it.
    seen        bigint      NOT NULL,
    -- Every token drawn after the change is greater than this.
    floor       bigint      NOT NULL,
    at          timestamptz NOT NULL,
    -- Until when acquisitions are refused (the grant delay); NULL: none.
    grant_after timestamptz,
    -- 'migrated' (the first row), 'timeline' (found by pglease) or the
    -- administrator's reason (pglease.restored).
    cause       text        NOT NULL
);

-- Present once this server has been checked against _timelines since it
-- last started from a crash, a promotion or a restore: the table is
-- UNLOGGED, so PostgreSQL empties it in each of those (crash recovery and
-- the end of archive recovery reset unlogged tables, and a base backup
-- holds none of their rows), and a clean restart keeps it. One row.
CREATE UNLOGGED TABLE pglease._checked (
    one         boolean     NOT NULL PRIMARY KEY DEFAULT true CHECK (one),
    timeline    bigint      NOT NULL,
    floor       bigint      NOT NULL,
    grant_after timestamptz
);

-- The grant delay after a timeline change, set by an administrator
-- (pglease.set_grant_delay); '0' (the default): none. One row, which the
-- timeline check also locks, so that checks take turns.
CREATE TABLE pglease._timeline_config (
    one         boolean  NOT NULL PRIMARY KEY DEFAULT true CHECK (one),
    grant_delay interval NOT NULL DEFAULT interval '0'
);
INSERT INTO pglease._timeline_config DEFAULT VALUES;

-- The tokens of the leases that were valid when the latest change was
-- found, by name (see admit): the only tokens drawn before it that
-- admit still accepts, while their lease stays valid.
CREATE TABLE pglease._carried (
    token bigint NOT NULL PRIMARY KEY,
    name  text   NOT NULL
);

-- Creators of a new name take turns on one of these rows (see acquire):
-- unlike an advisory key, only pglease can lock them.
CREATE TABLE pglease._creators (slot integer NOT NULL PRIMARY KEY);
INSERT INTO pglease._creators SELECT g FROM generate_series(0, 255) AS g;

REVOKE ALL ON pglease.leases, pglease.fences, pglease._history, pglease.fence_seq,
              pglease.lease_id_seq, pglease._history_config, pglease.name_grants,
              pglease._protected, pglease._creators, pglease._timelines, pglease._checked,
              pglease._timeline_config, pglease._carried
    FROM PUBLIC;


-- Result of acquire. When the lease was not acquired, token is NULL and
-- expires_at/holder describe the current holder; note is NULL, except when
-- the lease has ended but could not be taken, where it says why.
CREATE TYPE pglease.acquisition AS (
    token      bigint,
    expires_at timestamptz,
    holder     text,
    checked_at timestamptz,  -- the database time the decision was made at
    note       text,
    -- The process id of the server session the lease is bound to (see
    -- SESSION-BOUND LEASES), whether or not it was acquired; NULL if none.
    holder_session integer,
    -- Not acquired because of the grant delay after a timeline change
    -- (see TIMELINES): until when; NULL otherwise.
    delayed_until timestamptz,
    -- How many acquirers wait in line before this one (see LINES): set
    -- for an acquisition with a ticket, and when the line is why the
    -- lease was not acquired; NULL otherwise.
    ahead integer,
    -- The name is served first come, first served for every acquirer
    -- (set_fair): a waiter should join its line. Set in every refusal
    -- by acquire of a name that exists (as read at its start); NULL in an
    -- acquisition, for a name never acquired, and in the answers of the
    -- other acquiring functions.
    fair boolean
);

-- Result of acquire_counted: acquire's answer, and the slot it concerns.
CREATE TYPE pglease.counted_acquisition AS (
    token      bigint,
    expires_at timestamptz,
    holder     text,
    checked_at timestamptz,
    note       text,
    slot_name  text,
    holder_session integer,
    delayed_until timestamptz
);

------------------------------------------------------------------------
-- Input validation: SQLSTATE 22023 (invalid_parameter_value), a message
-- naming the argument, and the argument's name in the error's COLUMN field
-- (for clients), raised before anything is read or written.
------------------------------------------------------------------------

-- The hot functions test all their arguments in one expression and call
-- these only when that test fails, for the exact message. The helpers use
-- only built-in functions (pg_catalog is always searched first) and carry
-- no SET clause. They return their argument so that callers can use them
-- in an assignment, which PL/pgSQL evaluates without going through SPI.
CREATE FUNCTION pglease._check_text(argument text, value text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = argument,
            MESSAGE = format('pglease: %s must not be NULL', argument);
    END IF;
    IF octet_length(value) = 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = argument,
            MESSAGE = format('pglease: %s must not be empty', argument);
    END IF;
    IF octet_length(value) > pglease._max_text_bytes() THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = argument,
            MESSAGE = format('pglease: %s is %s bytes long; the limit is %s bytes of UTF-8',
                             argument, octet_length(value), pglease._max_text_bytes());
    END IF;
    RETURN value;
END
$$;

CREATE FUNCTION pglease._check_token(token bigint)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF token IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'token',
            MESSAGE = 'pglease: token must not be NULL';
    END IF;
    RETURN token;
END
$$;

-- Returns the ttl as an exact number of seconds (see CLOCK above).
CREATE FUNCTION pglease._check_ttl(ttl interval)
RETURNS interval
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    seconds numeric;
BEGIN
    IF ttl IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'ttl',
            MESSAGE = 'pglease: ttl must not be NULL';
    END IF;
    seconds := extract(epoch FROM ttl);
    IF seconds <= 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'ttl',
            MESSAGE = format('pglease: ttl must be greater than zero, got %s', ttl);
    END IF;
    IF seconds > pglease._max_ttl_seconds() THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'ttl',
            MESSAGE = format('pglease: ttl must be at most %s, got %s',
                             justify_hours(make_interval(secs => pglease._max_ttl_seconds())), ttl);
    END IF;
    RETURN make_interval(secs => seconds::double precision);
END
$$;

------------------------------------------------------------------------
-- Authority (see AUTHORITY at the top).
------------------------------------------------------------------------

-- The migration creates the administrator role when it may create roles;
-- otherwise only superusers and members of the owner are administrators.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pglease_admin') THEN
        IF (SELECT r.rolsuper OR r.rolcreaterole FROM pg_roles AS r WHERE r.rolname = current_user) THEN
            -- Roles belong to the server: migrations of two databases may
            -- both find it missing, and the second one's CREATE fails.
            BEGIN
                CREATE ROLE pglease_admin NOLOGIN;
                COMMENT ON ROLE pglease_admin IS
                    'pglease administrators: force_release, the history''s settings, name '
                    'grants, and acting under any lease''s token (in every database of this '
                    'server).';
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;
            END;
        ELSE
            RAISE NOTICE 'pglease: role pglease_admin does not exist and % may not create it: '
                         'only superusers and members of % are pglease administrators',
                         current_user, current_user;
        END IF;
    END IF;
END
$$;

-- SECURITY DEFINER, so current_user is the role that owns the functions.
CREATE FUNCTION pglease.is_admin()
RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_has_role(session_user, current_user, 'MEMBER')
        OR coalesce((SELECT pg_has_role(session_user, r.oid, 'MEMBER')
                       FROM pg_roles AS r WHERE r.rolname = 'pglease_admin'), false)
$$;

COMMENT ON FUNCTION pglease.is_admin() IS
    'Whether this session''s login role (session_user) is a pglease administrator: a '
    'superuser, a member of the role that owns the pglease functions, or a member of '
    'pglease_admin.';

-- May this session act under a token acquired by login role OWNER? The
-- hot functions test owner = session_user inline first. Internal: called
-- inside the SECURITY DEFINER functions only. PL/pgSQL, like the next
-- one, because a SQL function that cannot be inlined is planned again in
-- every transaction that calls it, and a PL/pgSQL one keeps its plans for
-- the session.
CREATE FUNCTION pglease._may_act(owner name)
RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN owner = session_user
        OR coalesce((SELECT pg_catalog.pg_has_role(session_user, r.oid, 'MEMBER')
                       FROM pg_catalog.pg_roles AS r WHERE r.rolname = owner), false)
        OR pglease.is_admin();
END
$$;

REVOKE ALL ON FUNCTION pglease._may_act(name) FROM PUBLIC;

-- May this session acquire NAME, or ask its holder to step down? Yes if no
-- granted prefix covers it, if session_user is a member of a role granted
-- one that does, or if it is an administrator. Internal, as _may_act.
CREATE FUNCTION pglease._may_use_name(name text)
RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN NOT EXISTS (SELECT 1 FROM pglease.name_grants AS g
                        WHERE pg_catalog.starts_with(_may_use_name.name, g.prefix))
        OR EXISTS (SELECT 1 FROM pglease.name_grants AS g
                     JOIN pg_catalog.pg_roles AS r ON r.rolname = g.role
                    WHERE pg_catalog.starts_with(_may_use_name.name, g.prefix)
                      AND pg_catalog.pg_has_role(session_user, r.oid, 'MEMBER'))
        OR pglease.is_admin();
END
$$;

REVOKE ALL ON FUNCTION pglease._may_use_name(text) FROM PUBLIC;

CREATE FUNCTION pglease._refuse_name(name text, action text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = '42501',
        MESSAGE = format('pglease: role %I may not %s lease %L: its name is under a prefix '
                         'granted to other roles (pglease.name_grants)', session_user, action, name);
END
$$;

REVOKE ALL ON FUNCTION pglease._refuse_name(text, text) FROM PUBLIC;

-- Raises 42501: this session may not ACTION lease NAME, which login role
-- OWNER acquired. The one wording of that refusal.
CREATE FUNCTION pglease._refuse_owner(name text, owner name, action text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = '42501',
        MESSAGE = format('pglease: role %I may not %s lease %L: it was acquired by role %I, '
                         'and only that role, its members and pglease administrators may '
                         'act under its token', session_user, action, name, owner);
END
$$;

REVOKE ALL ON FUNCTION pglease._refuse_owner(text, name, text) FROM PUBLIC;

-- Called when an operation under (NAME, TOKEN) changed nothing: raises
-- 42501 if the lease is valid under that token but this session may not
-- act under it, so that a refusal is never mistaken for a lost lease.
CREATE FUNCTION pglease._refuse_foreign(name text, token bigint, action text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    owner name;
BEGIN
    SELECT l.role INTO owner FROM pglease.leases AS l
     WHERE l.name = _refuse_foreign.name AND l.token = _refuse_foreign.token
       AND l.holder IS NOT NULL AND clock_timestamp() < l.expires_at;
    IF FOUND AND NOT pglease._may_act(owner) THEN
        PERFORM pglease._refuse_owner(_refuse_foreign.name, owner, action);
    END IF;
END
$$;

REVOKE ALL ON FUNCTION pglease._refuse_foreign(text, bigint, text) FROM PUBLIC;

-- Name grants: administrators only.
CREATE FUNCTION pglease.grant_names(prefix text, role name)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked text;
BEGIN
    checked := pglease._check_text('prefix', grant_names.prefix);
    IF NOT pglease.is_admin() THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('pglease: role %I may not grant names: pglease administrators only',
                             session_user);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles AS r WHERE r.rolname = grant_names.role) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'role',
            MESSAGE = format('pglease: role %I does not exist', grant_names.role);
    END IF;
    INSERT INTO pglease.name_grants AS g (prefix, role, granted_by, granted_at)
    VALUES (grant_names.prefix, grant_names.role, session_user, clock_timestamp())
    ON CONFLICT ON CONSTRAINT name_grants_pkey DO NOTHING;
END
$$;

COMMENT ON FUNCTION pglease.grant_names(text, name) IS
    'Administrators only: grant the lease names that start with PREFIX to ROLE. A name '
    'under any granted prefix may then be acquired (and its holder asked to step down) '
    'only by members of a role granted a prefix of it, or administrators.';

CREATE FUNCTION pglease.revoke_names(prefix text, role name)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT pglease.is_admin() THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('pglease: role %I may not revoke names: pglease administrators only',
                             session_user);
    END IF;
    DELETE FROM pglease.name_grants AS g
     WHERE g.prefix = revoke_names.prefix AND g.role = revoke_names.role;
    RETURN FOUND;
END
$$;

COMMENT ON FUNCTION pglease.revoke_names(text, name) IS
    'Administrators only: undo grant_names(PREFIX, ROLE). Returns whether it was granted.';

------------------------------------------------------------------------
-- Sessions of session-bound leases (the status view is part 14).
------------------------------------------------------------------------

-- Whether the server session PID (started at STARTED, if known) that a
-- session-bound lease records has ended: no such session in
-- pg_stat_get_activity. Never true for the calling session. Without a
-- start time (or where it cannot be read), a live session with a reused
-- process id counts as the holder's: the lease then waits for its expiry.
-- pg_stat_get_activity reads every session's entry once per transaction.
CREATE FUNCTION pglease._session_gone(pid integer, started timestamptz)
RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT $1 OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()
       AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_get_activity($1) AS a
                        WHERE a.pid OPERATOR(pg_catalog.=) $1
                          AND (a.backend_start IS NULL OR $2 IS NULL
                               OR a.backend_start OPERATOR(pg_catalog.=) $2))
$$;

COMMENT ON COLUMN pglease.leases.value IS
    'The value published by the holder of token value_token (pglease.set_value).';

COMMENT ON COLUMN pglease.leases.step_down_by IS
    'Who asked the holder of token step_down_token to step down (pglease.request_step_down), '
    'at step_down_at.';
