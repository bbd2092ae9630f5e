-- pglease: leases with fencing tokens, enforced by PostgreSQL.
--
-- The whole schema, in the order a reader learns it. Every object is
-- created once, here. Search for "-- N. " (a part's banner) to jump.
--
--  0. The rules every function keeps (this header): VOCABULARY, CLOCK,
--     LOCKS, SESSION-BOUND LEASES, DURABILITY, PRIVILEGES, AUTHORITY,
--     NO TRIGGERS.
--  1. Limits, tables, input checks and authority:
--     _max_text_bytes, _max_ttl_seconds, _max_value_bytes,
--     _timeline_margin, _max_slots; fence_seq, lease_id_seq; leases,
--     fences, _history, _history_config, name_grants, _protected,
--     _timelines, _checked, _timeline_config, _carried, _creators; types
--     acquisition, counted_acquisition; _check_text, _check_token,
--     _check_ttl; is_admin, _may_act, _may_use_name, _refuse_name,
--     _refuse_owner, _refuse_foreign, grant_names, revoke_names;
--     _session_gone.
--  2. Taking, keeping and giving up leases: _marker, _fenced_pids,
--     _key_holders, _end_fenced, _fenced_grace_ms, _fenced_ended,
--     _take_over, _create, acquire, renew,
--     renew_many, _watch_key, watch, unwatch, release,
--     can_end_stale_transactions.
--  3. Fencing, the database as the enforcement point: assert_held, view
--     fenced, _guard, _check_may_alter, _bind, protect, unprotect, view
--     protected; declared sessions: _session_marker, _check_session,
--     _fence_ddl, fence_ddl, ddl_fenced, migration_tools, _declared_pids,
--     _end_declared, view declared; admit.
--  4. Timelines, a server that forgot commits (failover to an
--     asynchronous standby, restore from backup): _refuse_standby,
--     server_timeline, _forgotten, forgotten_in, _timeline_checked,
--     _no_grant_now, view timelines, restored, set_grant_delay, view
--     grant_delay.
--  5. A value per lease: set_value.
--  6. Changes notified to observers, and step-down requests: observe,
--     unobserve, request_step_down.
--  7. The history, and the break-glass release that fences: view
--     history, set_history, view history_settings, _record,
--     _purge_history, _changed (the observers' notification, called with
--     _record), _lock_to_end, _force_shared, force_release.
--  8. Counted leases: _counted, acquire_counted.
--  9. The security posture, for `pglease doctor`: audit.
-- 10. Several leases at once, all or none: _max_set_names, _check_names,
--     type set_acquisition, acquire_all.
-- 11. First-come-first-served waiting: _max_waiting, line_seq, _line,
--     _place_lives, type place, _ahead, enqueue, dequeue, view line,
--     set_fair.
-- 12. Shared leases, many holders or one: _shared, _writer_waits,
--     acquire_shared, _lock_for_shared, _own_shared, _renew_shared,
--     _release_shared, assert_shared, view shared.
-- 13. Handover to a named successor: hand_over, _successor_place,
--     successor_waits.
-- 14. One picture of a name, whoever holds it: view status.
-- =====================================================================
-- 0. THE RULES EVERY FUNCTION KEEPS
-- =====================================================================
--
-- VOCABULARY. A lease has a name (the resource), a holder (who), a token
-- (which acquisition: the fence) and an expires_at (until when). A lease is
-- valid at time t iff its token is the row's current token, the row has a
-- holder, and t < expires_at. Equality is expired.
--
-- CLOCK. Every decision uses the database server's clock, never a client's.
-- Every function reads clock_timestamp() (the time the statement actually
-- runs), never now(): now() is the start of the caller's transaction, and a
-- check made late in a long transaction against now() would accept a lease
-- that has already expired. Each check reads the clock *after* the row lock
-- it depends on is held, so a wait for a lock cannot make the clock stale.
-- TTLs are converted to an exact number of seconds before they are added,
-- so '1 day' is always 86400 s and never depends on the session's TimeZone
-- (a calendar day across a DST change is 23 or 25 hours).
--
-- LOCKS. Every function that changes a token (acquire, force_release)
-- first locks the row FOR UPDATE, explicitly: the token is not in any
-- index, so the UPDATE alone would take only FOR NO KEY UPDATE, and the
-- updates stay HOT (no index entry per acquisition). assert_held takes
-- FOR KEY SHARE, which conflicts only with FOR UPDATE: while a fenced
-- transaction is open no acquisition of its lease can commit, but renew
-- and release (FOR NO KEY UPDATE) proceed.
-- Advisory locks are a hint between sessions, never a fact: any role can
-- take any key, so no decision rests on who holds one and no wait on one
-- is unbounded (see AUTHORITY). Key spaces (first key): 0x706c7761 "plwa"
-- (watchers of a name, see release), 0x706c6f62 "plob" (observers of a
-- name, see observe), 0x706c7362 "plsb" (a session holding session-bound
-- leases, keyed by its process id; see SESSION-BOUND LEASES); fenced
-- transactions carry a 64-bit key derived from
-- a secret of their lease and their transaction id (see assert_held), which
-- nobody without the secret can take first; the migrator's own lock is the
-- 64-bit key of the bytes "pglease".
--
-- SESSION-BOUND LEASES (opt-in: acquire's session_bound). The lease also
-- ends when the server session that acquired it ends: the row records
-- that session (leases.session_pid, and session_start where the role that
-- owns the functions may read pg_stat_activity's backend_start), and an
-- acquirer that finds the lease valid but no such session in
-- pg_stat_get_activity takes it at once, fenced like any takeover (new
-- token, stale fenced transactions ended); renew refuses to extend it.
-- The session's existence is read from the server, never from an
-- argument. A process id reused by a new session in between (when the
-- start time cannot be read) only makes the lease wait for its expiry, as
-- an unbound one does. The session also holds the advisory lock
-- (0x706c7362, its pid) until it ends, so that a waiter can block on it
-- and wake when the session is gone; that lock is only a wake-up, never
-- what is decided on (anyone may take any key: the worst a role can do
-- with it is delay a waiter until the lease's expiry).
--
-- DURABILITY. What the database acknowledged, it keeps, whatever
-- synchronous_commit the server or the session has: acquire, renew,
-- renew_many, admit and force_release raise synchronous_commit to 'on'
-- for their own transaction when it is weaker. With asynchronous commit a
-- crash could roll back both the lease row and the sequence and issue the
-- same token twice, or roll back a renewal and end a lease earlier than
-- its holder was told (with a synchronous standby, 'on' also waits for
-- the standby). release and set_value keep the caller's setting: losing
-- one in a crash makes a lease last longer than its holder believes, or
-- loses a value, but never shortens a validity that was acknowledged or
-- reissues a token. A server that forgets commits by design (a promoted
-- asynchronous standby, a restore from backup) continues on a new
-- timeline, and no token drawn there repeats one the old timeline could
-- have issued: see TIMELINES.
--
-- PRIVILEGES. The functions that change leases are SECURITY DEFINER with a
-- fixed search_path: an application role may call them (GRANT EXECUTE)
-- without being able to update the tables, and a caller's search_path
-- cannot reach inside them. Nothing is granted to PUBLIC on the tables.
--
-- AUTHORITY. The principal is the session's login role, session_user:
-- SET ROLE does not change it (a session can always RESET ROLE, so SET
-- ROLE is no boundary), and a pooler that logs in as each client's own
-- role (PgBouncer's default) keeps it. An acquisition records it
-- (leases.role); renew, renew_many, release, set_value and assert_held
-- (and so protected writes) under the lease's token succeed only when
-- session_user is that role or a member of it (pg_has_role ... MEMBER),
-- or an administrator; anyone else gets SQLSTATE 42501 and nothing
-- changes. Administrators (pglease.is_admin()): superusers, members of
-- the role that owns the pglease functions, and members of the role
-- pglease_admin (created by the migration when the migrator may create
-- roles; roles belong to the server, so it is administrator of pglease in
-- every database of that server). force_release and the history's
-- settings are theirs alone. Names may be granted to roles by prefix
-- (pglease.grant_names): a name under a granted prefix can be acquired,
-- and its holder asked to step down, only by a member of a role granted a
-- prefix of it, or an administrator; names under no granted prefix are
-- open to every role that may call the functions. Tokens are not secrets
-- (they travel to the resources they fence): authority comes from the
-- role, never from knowing a token. Settings any session can SET
-- (pglease.declared, the lock counters) only ever say what to check, or
-- cost their own session; nothing else is taken from them.
--
-- NO TRIGGERS. Each function that changes a lease's holder, token, value
-- or step-down request records the transition (pglease._record) and tells
-- observers (pglease._changed) itself, in the transaction that makes it;
-- renew counts the term's renewals in its own UPDATE. A row trigger on
-- the leases table cost about a fifth of a renew or release (PostgreSQL
-- prepares a table's triggers and CHECK constraints again for every
-- statement that writes it), and only these functions write the table.

CREATE SCHEMA IF NOT EXISTS pglease;

COMMENT ON SCHEMA pglease IS
    'Leases with fencing tokens enforced by PostgreSQL (see the pglease README).';

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

-- =====================================================================
-- 2. TAKING, KEEPING AND GIVING UP LEASES
--
-- acquire, renew, renew_many and release are each one statement from the
-- client, so their cost is the server's work inside the call: they test
-- all their arguments in one expression (the input helpers above run only
-- when it fails, for the exact message), read only the columns they decide
-- on, and raise synchronous_commit inline.
-- =====================================================================

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
    cur_holder text;
    cur_expiry timestamptz;
    cur_token  bigint;
    cur_pid    integer;
    cur_start  timestamptz;
    -- The token of a valid term whose holder's session has ended (see
    -- SESSION-BOUND LEASES): that term counts as ended.
    gone_token bigint;
    my_pid     integer;
    my_start   timestamptz;
    new_id     bigint;
    found_row  boolean;
    name_ok    boolean := false;
    note       text;
    t          timestamptz;
    delayed    timestamptz;
    result     pglease.acquisition;
    -- Someone may wait in line for the name (see LINES); how many do
    -- before this acquisition.
    line_set   boolean;
    ahead      integer;
    -- Until when shared holders hold it (see SHARED LEASES).
    readers    timestamptz;
    -- The place the current term was handed over to (see HANDOVER).
    handed     bigint;
    cur_role   name;
    -- Every waiter for the name waits in line (set_fair).
    name_fair  boolean;
    -- The history records (see HISTORY).
    history_on boolean;
    -- The token of the term this acquisition took over, when that term
    -- ended without a release, and the role that held it.
    ended_term bigint;
    ended_role name;
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

    -- Fast path, read-only: a held, unexpired lease is reported without a
    -- row lock, a token, WAL or a commit flush, also while fenced
    -- transactions hold it. A session-bound one is held while its session
    -- lives. Read twice at most (see the handover below).
    FOR look IN 1 .. 2 LOOP
        SELECT l.holder, l.expires_at, l.token, l.session_pid, l.session_start, l.queued,
               l.readers_until, l.handed_to, l.role, l.fair
          INTO cur_holder, cur_expiry, cur_token, cur_pid, cur_start, line_set, readers,
               handed, cur_role, name_fair
          FROM pglease.leases AS l WHERE l.name = acquire.name;
        found_row := FOUND;
        t := clock_timestamp();
        EXIT WHEN cur_holder IS NULL OR t >= cur_expiry;
        -- Handed over to this acquisition's place in line (see HANDOVER):
        -- the term is its own.
        IF handed = acquire.ticket AND cur_holder = acquire.holder
           AND (cur_role = session_user OR pglease._may_act(cur_role))
           AND NOT pg_is_in_recovery() THEN
            IF acquire.session_bound THEN
                -- Bound to the session that takes the term (see
                -- SESSION-BOUND LEASES).
                UPDATE pglease.leases AS l
                   SET session_pid = pg_backend_pid(),
                       session_start = (SELECT a.backend_start
                                          FROM pg_stat_get_activity(pg_backend_pid()) AS a)
                 WHERE l.name = acquire.name AND l.token = cur_token;
                PERFORM pg_try_advisory_lock(1886155618, pg_backend_pid());
                cur_pid := pg_backend_pid();
            END IF;
            RETURN ROW(cur_token, cur_expiry, cur_holder, t, 'handed over', cur_pid, NULL,
                       0, NULL)::pglease.acquisition;
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
    IF acquire.session_bound THEN
        my_pid := pg_backend_pid();
        SELECT a.backend_start INTO my_start FROM pg_stat_get_activity(my_pid) AS a;
    END IF;

    -- A standby takes nothing (and cannot read pglease._checked).
    IF pg_is_in_recovery() THEN
        PERFORM pglease._refuse_standby('acquire a lease');
    END IF;

    -- The common path: a released lease whose name uses none of the
    -- uncommon features (nobody has waited in line, no shared holder, no
    -- name grant, no session binding, no place in line), decided from the
    -- row just read, is taken by one statement. It takes nothing when the
    -- row changed since, is locked (a fenced transaction, another
    -- acquirer), a name grant covers the name, or the timeline is not
    -- checked or a grant delay runs (see TIMELINES, evaluated once per
    -- statement): then the way below decides, as for everything else (an
    -- expired term to record, a name never acquired). The token is drawn
    -- under the lock, by the statement that checks the timeline. The
    -- statement repeats the first try's below on purpose: one statement
    -- for both, with the history inserted apart, ran the cycle at 0.62 to
    -- 0.67 of the floor against 0.73 to 0.76 (docs/benchmark.md); a guard
    -- added to one belongs in both.
    IF cur_holder IS NULL AND found_row AND NOT line_set AND readers IS NULL
       AND NOT acquire.session_bound AND acquire.ticket IS NULL THEN
        WITH s AS (
            SELECT l.name
              FROM pglease.leases AS l
             WHERE l.name = acquire.name
               AND l.holder IS NULL AND NOT l.queued AND l.readers_until IS NULL
               AND EXISTS (SELECT 1 FROM pglease._checked AS c
                            WHERE c.grant_after IS NULL OR c.grant_after <= clock_timestamp())
               AND NOT EXISTS (SELECT 1 FROM pglease.name_grants AS g
                                WHERE starts_with(acquire.name, g.prefix))
               FOR UPDATE OF l SKIP LOCKED
        ), u AS (
            UPDATE pglease.leases AS l
               SET holder = acquire.holder,
                   role = session_user,
                   token = nextval('pglease.fence_seq'),
                   expires_at = clock_timestamp() + make_interval(secs => seconds::double precision),
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
        IF FOUND THEN
            IF history_on THEN
                INSERT INTO pglease._history (name, token, event, holder, at, role)
                VALUES (acquire.name, result.token, 'acquired', acquire.holder, t, session_user)
                RETURNING _history.id INTO new_id;
                IF new_id % 128 = 0 THEN
                    PERFORM pglease._purge_history(new_id);
                END IF;
            END IF;
            -- Durable whatever the session's synchronous_commit (see
            -- DURABILITY at the top).
            IF current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
                checked := set_config('synchronous_commit', 'on', true);
            END IF;
            PERFORM pglease._changed(acquire.name);
            result.holder := acquire.holder;
            result.checked_at := t;
            RETURN result;
        END IF;
    END IF;

    -- The line (see LINES), read only when someone has joined it since it
    -- was last found empty, when this acquisition has a place in it, or
    -- for a name never acquired (its line has no row to mark): nobody who
    -- waits in line is overtaken by a later acquirer.
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

    -- Held shared: refused, and new shared holders wait behind this
    -- acquisition (see SHARED LEASES), unless the last one has just
    -- released.
    IF readers > t THEN
        -- The mark is a write: names granted to other roles refuse first.
        IF NOT pglease._may_use_name(acquire.name) THEN
            PERFORM pglease._refuse_name(acquire.name, 'acquire');
        END IF;
        result := pglease._writer_waits(acquire.name, acquire.holder, ahead, acquire.waits);
        IF result.expires_at > result.checked_at THEN
            result.fair := name_fair;
            RETURN result;
        END IF;
        result := NULL;
    END IF;

    -- Taking the lease is one statement, tried at most twice: at once in
    -- the usual case (the row exists, nobody locks it, no name grant
    -- covers the name), else after the long way below has done what that
    -- case needs (this transaction then holds FOR UPDATE on the row).
    --
    -- The statement: FOR UPDATE SKIP LOCKED in s, which the update joins:
    -- a row that someone else locks (a fenced transaction, another
    -- acquirer) is not updated, and on the first try neither is one that
    -- a name grant covers. The lease is decided on the latest row version
    -- with a clock read as the update runs, after the lock (a version
    -- committed after this statement began makes PostgreSQL evaluate the
    -- WHERE clause again on it). The token is drawn only for the row
    -- updated, under the lock: for each name, tokens strictly increase in
    -- commit order. The history rows are inserted by the same statement.
    FOR pass IN 1 .. 2 LOOP
        IF pass = 2 THEN
            -- No token before this server's timeline has been checked, and
            -- none during the grant delay after a change (see TIMELINES):
            -- the first try's statement takes nothing until both are so.
            SELECT g.why, g.delayed_until INTO note, delayed
              FROM pglease._no_grant_now('acquire') AS g;
            t := clock_timestamp();
            IF note IS NOT NULL THEN
                RETURN ROW(NULL, coalesce(cur_expiry, t), cur_holder, t, note, cur_pid, delayed,
                           NULL, name_fair)::pglease.acquisition;
            END IF;

            -- Names granted by prefix (see AUTHORITY), checked before anything
            -- is written.
            IF NOT pglease._may_use_name(acquire.name) THEN
                PERFORM pglease._refuse_name(acquire.name, 'acquire');
            END IF;

            IF NOT found_row THEN
                note := pglease._create(acquire.name);
                IF note IS NOT NULL THEN
                    t := clock_timestamp();
                    RETURN ROW(NULL, t, NULL, t, note, NULL, NULL, NULL, name_fair)::pglease.acquisition;
                END IF;
            END IF;

            -- Usually nobody else locks the row: take FOR UPDATE at once.
            SELECT l.holder, l.expires_at, l.token, l.session_pid, l.readers_until
              INTO cur_holder, cur_expiry, cur_token, cur_pid, readers
              FROM pglease.leases AS l WHERE l.name = acquire.name FOR UPDATE SKIP LOCKED;
            IF NOT FOUND THEN
                SELECT o.note, o.held_by, o.held_until, o.held_session, o.decided_at
                  INTO note, cur_holder, cur_expiry, cur_pid, t
                  FROM pglease._take_over(acquire.name, gone_token) AS o;
                SELECT l.readers_until INTO readers
                  FROM pglease.leases AS l WHERE l.name = acquire.name;
                IF readers > clock_timestamp() THEN
                    result := pglease._writer_waits(acquire.name, acquire.holder, NULL,
                                                    acquire.waits);
                    IF result.expires_at > result.checked_at THEN
                        result.fair := name_fair;
                        RETURN result;
                    END IF;
                    result := NULL;
                END IF;
                IF note = '' THEN
                    -- Held, as decided (see _take_over).
                    RETURN ROW(NULL, cur_expiry, cur_holder, t, NULL, cur_pid, NULL, NULL, name_fair)::pglease.acquisition;
                END IF;
                -- The committed row: locked by this transaction if taken;
                -- otherwise the lease has ended (expires_at <= checked_at, or
                -- holder NULL), a transaction that could not be ended pins
                -- it, and note says why.
                SELECT l.holder, l.expires_at, l.token, l.session_pid
                  INTO cur_holder, cur_expiry, cur_token, cur_pid
                  FROM pglease.leases AS l WHERE l.name = acquire.name;
                IF note IS NOT NULL THEN
                    -- For the server's log (the caller gets it in the answer).
                    RAISE WARNING USING MESSAGE = format('pglease: lease %L has ended, but %s',
                                                         acquire.name, note);
                    RETURN ROW(NULL, cur_expiry, cur_holder, clock_timestamp(),
                               note, cur_pid, NULL, NULL, name_fair)::pglease.acquisition;
                END IF;
            END IF;
            -- Decide on the latest row version and a clock read after the lock.
            t := clock_timestamp();
            IF cur_holder IS NOT NULL AND t < cur_expiry AND cur_token IS DISTINCT FROM gone_token THEN
                RETURN ROW(NULL, cur_expiry, cur_holder, t, NULL, cur_pid, NULL, NULL, name_fair)::pglease.acquisition;
            END IF;
            IF readers > t THEN
                result := pglease._writer_waits(acquire.name, acquire.holder, NULL,
                                                acquire.waits);
                IF result.expires_at > result.checked_at THEN
                    result.fair := name_fair;
                    RETURN result;
                END IF;
                -- The last shared holder has just ended: take it.
                result := NULL;
            END IF;
            name_ok := true;
            found_row := true;
        END IF;
        IF found_row THEN
            WITH s AS (
                SELECT l.name, l.holder, l.token, l.expires_at, l.renewals, l.role
                  FROM pglease.leases AS l
                 WHERE l.name = acquire.name
                   -- Checked on this timeline, and not within a grant delay
                   -- (evaluated once per statement: see TIMELINES).
                   AND EXISTS (SELECT 1 FROM pglease._checked AS c
                                WHERE c.grant_after IS NULL OR c.grant_after <= clock_timestamp())
                   FOR UPDATE OF l SKIP LOCKED
            ), u AS (
                UPDATE pglease.leases AS l
                   SET holder = acquire.holder,
                       role = session_user,
                       token = nextval('pglease.fence_seq'),
                       expires_at = clock_timestamp() + make_interval(secs => seconds::double precision),
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
                        OR l.token = gone_token)
                   AND (l.readers_until IS NULL OR clock_timestamp() >= l.readers_until)
                   AND (name_ok OR NOT EXISTS (SELECT 1 FROM pglease.name_grants AS g
                                                WHERE starts_with(acquire.name, g.prefix)))
                RETURNING l.token, l.expires_at, l.acquired_at, s.holder AS old_holder,
                          s.token AS old_token, s.expires_at AS old_expiry, s.renewals AS old_renewals,
                          s.role AS old_role
            ), h AS (
                -- The term before ended without a release: it expired
                -- (recorded at the time it did), or its holder's session
                -- ended (recorded now). Then this term.
                INSERT INTO pglease._history (name, token, event, holder, at, renewals, detail, role)
                SELECT acquire.name, e.token, e.event, e.holder, e.at, e.renewals, e.detail, session_user
                  FROM u
                 CROSS JOIN pglease._history_config AS c
                 CROSS JOIN LATERAL (VALUES (u.old_token, 'expired', u.old_holder,
                                             least(u.old_expiry, u.acquired_at), u.old_renewals,
                                             CASE WHEN u.old_expiry > u.acquired_at
                                                  THEN 'its holder''s session ended' END,
                                             u.old_holder IS NOT NULL AND u.old_token > 0),
                                            (u.token, 'acquired', acquire.holder, u.acquired_at,
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
            IF FOUND THEN
                -- The term before ended without a release: the sessions
                -- declared under it are stale (see DECLARED SESSIONS).
                IF ended_term IS NOT NULL THEN
                    PERFORM pglease._end_declared(acquire.name, ended_term, ended_role);
                END IF;
                -- Durable whatever the session's synchronous_commit (see
                -- DURABILITY at the top).
                IF current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
                    checked := set_config('synchronous_commit', 'on', true);
                END IF;
                IF new_id % 128 = 0 THEN
                    PERFORM pglease._purge_history(new_id);
                END IF;
                IF acquire.ticket IS NOT NULL THEN
                    -- Out of the line: its place is taken.
                    DELETE FROM pglease._line AS q
                     WHERE q.name = acquire.name AND q.ticket = acquire.ticket;
                    result.ahead := 0;
                END IF;
                IF acquire.session_bound THEN
                    -- The wake-up for waiters (see SESSION-BOUND LEASES),
                    -- held until the session ends; taken again by each
                    -- session-bound acquisition (a counter, one lock).
                    PERFORM pg_try_advisory_lock(1886155618, my_pid);
                END IF;
                PERFORM pglease._changed(acquire.name);
                result.holder := acquire.holder;
                result.checked_at := t;
                result.holder_session := my_pid;
                RETURN result;
            END IF;
        END IF;
    END LOOP;
    -- Not reached: the long way holds the row lock and found the lease
    -- ended, so the second try takes it. Report the row as it is.
    SELECT l.holder, l.expires_at, l.session_pid INTO cur_holder, cur_expiry, cur_pid
      FROM pglease.leases AS l WHERE l.name = acquire.name;
    RETURN ROW(NULL, cur_expiry, cur_holder, clock_timestamp(), NULL, cur_pid, NULL, NULL, name_fair)::pglease.acquisition;
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
    IF new_expiry IS NOT NULL
       AND current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
        -- The validity acknowledged must survive a crash (see DURABILITY).
        checked := set_config('synchronous_commit', 'on', true);
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
    IF cardinality(r_names) > 0
       AND current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
        -- The validity acknowledged must survive a crash (see DURABILITY).
        checked := set_config('synchronous_commit', 'on', true);
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

-- =====================================================================
-- 3. FENCING: THE DATABASE AS THE ENFORCEMENT POINT
--
-- A transaction that writes under a lease declares it with
-- assert_held(name, token): the check is made on the database clock, and
-- the lock it takes keeps any other acquisition from committing until the
-- transaction ends, so a write checked under a valid token cannot be
-- overtaken by a new holder. protect(tbl, name) makes a table demand that
-- declaration from every writer. admit(resource, token) is the fence for
-- a resource that keeps its own high-water mark instead.
-- =====================================================================

------------------------------------------------------------------------
-- assert_held(name, token): the guarded-write check.
------------------------------------------------------------------------

-- Besides the row lock, a transaction that passes the check takes the
-- marker by which an acquisition after the lease has ended finds it (and
-- ends it, see acquire): a shared advisory lock on a key derived from the
-- lease's secret and the transaction's id, until the transaction ends. The guard trigger of protected tables calls this
-- again at each write; taking a lock this transaction already holds costs
-- a look-up in the session's own lock table.
CREATE FUNCTION pglease.assert_held(name text, token bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked      text;
    cur_token    bigint;
    cur_holder   text;
    cur_expiry   timestamptz;
    cur_released timestamptz;
    cur_role     name;
    cur_secret   bytea;
    cur_pid      integer;
    cur_start    timestamptz;
    marker       bigint;
    t            timestamptz;
    declared     text;
    found_row    boolean;
    lost_in      pglease._timelines;
    my_xid       xid;
BEGIN
    IF NOT coalesce(octet_length(assert_held.name) BETWEEN 1 AND pglease._max_text_bytes()
                    AND assert_held.token IS NOT NULL, false) THEN
        checked := pglease._check_text('name', assert_held.name);
        PERFORM pglease._check_token(assert_held.token);
    END IF;

    -- FOR KEY SHARE lasts until the caller's transaction ends and blocks
    -- the FOR UPDATE lock every acquisition takes (see LOCKS at the top).
    SELECT l.token, l.holder, l.expires_at, l.released_at, l.role, l.secret, l.session_pid,
           l.session_start
      INTO cur_token, cur_holder, cur_expiry, cur_released, cur_role, cur_secret, cur_pid,
           cur_start
      FROM pglease.leases AS l WHERE l.name = assert_held.name FOR KEY SHARE;
    found_row := FOUND;
    -- The clock is read after the lock is held.
    t := clock_timestamp();
    IF NOT (found_row AND cur_token = assert_held.token AND cur_token <> 0
            AND cur_holder IS NOT NULL AND t < cur_expiry
            AND (cur_pid IS NULL OR NOT pglease._session_gone(cur_pid, cur_start))) THEN
        -- DETAIL says the same as data, for clients: space-separated
        -- key=value fields, name last (it may contain spaces); times in
        -- RFC 3339, UTC.
        IF NOT found_row OR cur_token <> assert_held.token THEN
            -- An acquisition this server forgot in a change of timeline
            -- has a reason of its own (see TIMELINES).
            lost_in := pglease._forgotten(assert_held.token, CASE WHEN found_row THEN cur_token END);
            IF lost_in.timeline IS NOT NULL THEN
                RAISE EXCEPTION USING ERRCODE = 'LE001',
                    MESSAGE = format('pglease: lease %L is not held under token %s: the database '
                                     'changed to timeline %s (a failover or a restore) and lost '
                                     'that acquisition with the old timeline''s latest commits',
                                     assert_held.name, assert_held.token, lost_in.timeline),
                    DETAIL = format('reason=forgotten token=%s timeline=%s name=%s',
                                    assert_held.token, lost_in.timeline, assert_held.name);
            END IF;
        END IF;
        IF found_row AND cur_token <> assert_held.token
           AND EXISTS (SELECT 1 FROM pglease._shared AS s
                        WHERE s.token = assert_held.token AND s.name = assert_held.name) THEN
            -- See SHARED LEASES.
            RAISE EXCEPTION USING ERRCODE = 'LE001',
                MESSAGE = format('pglease: lease %L is not held exclusively under token %s: it '
                                 'is a shared holder''s token, which pglease.assert_shared '
                                 'checks; writes under the lease need the exclusive holder''s',
                                 assert_held.name, assert_held.token),
                DETAIL = format('reason=shared token=%s name=%s', assert_held.token,
                                assert_held.name);
        END IF;
        IF NOT found_row OR cur_token = 0 THEN
            RAISE EXCEPTION USING ERRCODE = 'LE001',
                MESSAGE = format('pglease: lease %L is not held: it has never been acquired',
                                 assert_held.name),
                DETAIL = format('reason=never_acquired token=%s name=%s',
                                assert_held.token, assert_held.name);
        END IF;
        IF cur_token <> assert_held.token THEN
            RAISE EXCEPTION USING ERRCODE = 'LE001',
                MESSAGE = format('pglease: lease %L is not held under token %s: %s',
                                 assert_held.name, assert_held.token,
                                 CASE WHEN assert_held.token < cur_token
                                      THEN format('the token is stale, the lease was acquired again with token %s', cur_token)
                                      ELSE 'no such token has been issued for this lease' END),
                DETAIL = format('reason=%s token=%s current_token=%s name=%s',
                                CASE WHEN assert_held.token < cur_token THEN 'stale' ELSE 'not_issued' END,
                                assert_held.token, cur_token, assert_held.name);
        END IF;
        IF cur_holder IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'LE001',
                MESSAGE = format('pglease: lease %L is not held under token %s: it was released at %s',
                                 assert_held.name, assert_held.token, cur_released),
                DETAIL = format('reason=released token=%s at=%s name=%s', assert_held.token,
                                to_char(cur_released AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                                assert_held.name);
        END IF;
        IF t < cur_expiry THEN
            RAISE EXCEPTION USING ERRCODE = 'LE001',
                MESSAGE = format('pglease: lease %L is not held under token %s: the server session '
                                 'it was bound to (process %s) has ended',
                                 assert_held.name, assert_held.token, cur_pid),
                DETAIL = format('reason=session_ended token=%s pid=%s name=%s', assert_held.token,
                                cur_pid, assert_held.name);
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'LE001',
            MESSAGE = format('pglease: lease %L is not held under token %s: it expired at %s (database time now %s)',
                             assert_held.name, assert_held.token, cur_expiry, t),
            DETAIL = format('reason=expired token=%s at=%s name=%s', assert_held.token,
                            to_char(cur_expiry AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                            assert_held.name);
    END IF;

    -- Only the role that acquired the lease, its members and
    -- administrators act under its token (see AUTHORITY at the top).
    -- (Nested, so that the second test is prepared only when it is needed.)
    IF cur_role IS DISTINCT FROM session_user THEN
        IF NOT pglease._may_act(cur_role) THEN
            PERFORM pglease._refuse_owner(assert_held.name, cur_role, 'write under');
        END IF;
    END IF;

    -- The marker (see TAKEOVER at acquire), taken only once the token is
    -- found valid (a session is never ended for a check that fails).
    -- Nobody without the lease's secret can hold it first; should the try
    -- fail all the same, the check fails rather than leave this
    -- transaction unmarked (a frozen unmarked holder would pin the lease).
    -- The transaction id first, in a variable: with a volatile argument
    -- the SQL function _marker would not be inlined (about 8 us a call).
    my_xid := pg_current_xact_id()::xid;
    marker := pglease._marker(cur_secret, my_xid);
    IF NOT pg_try_advisory_xact_lock_shared(marker) THEN
        RAISE EXCEPTION USING ERRCODE = '55P03',
            MESSAGE = format('pglease: lease %L: this transaction''s fenced marker is held '
                             'exclusively by another session (%s)', assert_held.name,
                             pglease._key_holders(marker >> 32, marker, 1));
    END IF;

    -- Record the declaration for the rest of the transaction (protected
    -- tables read it): a JSON object mapping lease name to token.
    declared := current_setting('pglease.declared', true);
    IF declared IS NULL OR declared = '' THEN
        declared := jsonb_build_object(assert_held.name, assert_held.token)::text;
    ELSE
        declared := (declared::jsonb || jsonb_build_object(assert_held.name, assert_held.token))::text;
    END IF;
    checked := set_config('pglease.declared', declared, true);
END
$$;

COMMENT ON FUNCTION pglease.assert_held(text, bigint) IS
    'Inside a transaction: fail with SQLSTATE LE001 unless lease NAME is valid '
    'under TOKEN, and keep any other acquisition of NAME from committing until '
    'this transaction ends. Records the declaration for protected tables.';


-- Which sessions are fenced on which lease right now (the marker taken by
-- assert_held). It computes a marker per lease and transaction holding a
-- 64-bit advisory lock: about a microsecond each, so a second or so for
-- a million leases and one such transaction. A view for people; the
-- functions look a lease's sessions up by its secret.
CREATE VIEW pglease.fenced AS
SELECT l.name, f.pid
  FROM pglease.leases AS l
 CROSS JOIN LATERAL pglease._fenced_pids(l.secret) AS f(pid)
 WHERE l.token > 0
   AND EXISTS (SELECT 1 FROM pg_locks AS a WHERE a.locktype = 'advisory' AND a.objsubid = 1);

COMMENT ON VIEW pglease.fenced IS
    'Sessions (pid) with an open transaction fenced on each lease (pglease.assert_held). '
    'An acquisition after the lease has ended ends these sessions.';

------------------------------------------------------------------------
-- protect(tbl, name) / unprotect(tbl): tables that only a holder may write.
------------------------------------------------------------------------

-- protect(tbl, name) makes a table reject every INSERT (including COPY),
-- UPDATE, DELETE and TRUNCATE from a transaction that does not hold lease
-- NAME with a current, unexpired token; unprotect(tbl) undoes it. Code that
-- ignores the lease altogether is rejected, not only stale tokens.
--
-- A transaction declares its token with pglease.assert_held(name, token),
-- which records it in the transaction-local setting pglease.declared. A
-- write to a protected table without a declaration fails with SQLSTATE
-- LE002. With one, the trigger calls assert_held again: the token must
-- still be current and the database clock (clock_timestamp(), at the write)
-- before expires_at, or the write fails with LE001; and the FOR KEY SHARE
-- lock it takes keeps any other acquisition from committing until this
-- transaction ends. The setting itself proves nothing (anyone can SET it):
-- it only says which token to check, and the check is made on every write.
--
-- The triggers are statement-level BEFORE triggers: one check per write
-- statement, whatever the number of rows (the benchmark reports the cost
-- per row beside a row-level trigger). TRUNCATE only has statement-level
-- triggers anyway. A statement checked before expiry may write its rows
-- after it, as any write checked before expiry may commit after it; no
-- other acquisition can commit meanwhile. INSERT ... ON CONFLICT, MERGE,
-- writable CTEs and foreign-key cascades fire these triggers too.
-- Statement-level triggers are not inherited, so partitioned tables,
-- partitions and inheritance children are refused.
--
-- protect and unprotect require ownership of the table (or the privileges
-- of its owning role), not only the TRIGGER privilege. The lease a table
-- is protected by is bound in pglease._protected, which only protect and
-- unprotect write; the guard reads it there and ignores its trigger's
-- arguments, so a role granted TRIGGER (GRANT ALL includes it) cannot
-- point a table's fence at a lease it controls by replacing the trigger.
-- It can still replace or add triggers that PostgreSQL lets it: the view
-- pglease.protected says whether both guard triggers are intact, and
-- `pglease doctor` names the roles that hold TRIGGER on protected tables
-- (grant them SELECT, INSERT, UPDATE, DELETE only).

CREATE FUNCTION pglease._guard()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lease    text;
    declared text;
BEGIN
    SELECT p.name INTO lease FROM pglease._protected AS p WHERE p.tbl = TG_RELID;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = format('pglease: %s on %s rejected: the table has pglease''s guard '
                             'trigger but was not protected with pglease.protect',
                             TG_OP, TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME);
    END IF;
    declared := nullif(current_setting('pglease.declared', true), '')::jsonb ->> lease;
    IF declared IS NULL THEN
        -- A session that declared the lease for its whole life (see
        -- DECLARED SESSIONS below): its claim is checked as assert_held
        -- checks it, which also records it for the rest of the
        -- transaction. Read only here, so that a transaction that
        -- declared its token pays nothing for it.
        IF NOT pglease._check_session(lease) THEN
            RAISE EXCEPTION USING ERRCODE = 'LE002',
                MESSAGE = format('pglease: %s on %s rejected: the table is protected by lease %L '
                                 'and this transaction declared no token for it',
                                 TG_OP, TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME, lease),
                HINT = format('Call pglease.assert_held(%L, <token>) in the same transaction '
                              'first, or declare the lease for the session (pglease run '
                              '--declare).', lease);
        END IF;
    ELSE
        -- Re-check at the moment of this write (LE001 if stale or expired)
        -- and (re)take the lock that holds off other acquisitions until
        -- commit.
        PERFORM pglease.assert_held(lease, declared::bigint);
    END IF;
    IF TG_LEVEL = 'ROW' THEN
        RETURN coalesce(NEW, OLD);
    END IF;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION pglease._guard() IS
    'Trigger of protected tables (see pglease.protect): LE002 without a declared '
    'token for the lease, LE001 unless the declared token is still valid.';

-- What protect and unprotect check first: a table is named, and the
-- caller may alter it. Runs with the caller's rights: the caller must own
-- the table (or have the privileges of its owning role), as ALTER TABLE
-- requires; the TRIGGER privilege alone is not enough.
CREATE FUNCTION pglease._check_may_alter(tbl regclass, action text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    owner oid;
BEGIN
    IF tbl IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'tbl',
            MESSAGE = 'pglease: tbl must not be NULL';
    END IF;
    SELECT c.relowner INTO owner FROM pg_class AS c WHERE c.oid = tbl;
    IF owner IS NOT NULL AND NOT pg_has_role(current_user, owner, 'USAGE') THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('pglease: must be the owner of table %s to %s it', tbl, action);
    END IF;
END
$$;

-- Binds table TBL to lease NAME (NULL: unbinds it; returns whether it
-- was bound). SECURITY DEFINER to write the binding, so it checks again,
-- by the session's login role, that the caller may alter the table.
CREATE FUNCTION pglease._bind(tbl regclass, name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    owner oid;
BEGIN
    SELECT c.relowner INTO owner FROM pg_class AS c WHERE c.oid = _bind.tbl;
    IF owner IS NULL OR NOT pg_has_role(session_user, owner, 'MEMBER') THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('pglease: must be the owner of table %s to protect or unprotect it',
                             _bind.tbl);
    END IF;
    IF _bind.name IS NULL THEN
        DELETE FROM pglease._protected AS p WHERE p.tbl = _bind.tbl;
        RETURN FOUND;
    END IF;
    INSERT INTO pglease._protected AS p (tbl, name, protected_by, protected_at)
    VALUES (_bind.tbl, _bind.name, session_user, clock_timestamp())
    ON CONFLICT ON CONSTRAINT _protected_pkey DO UPDATE
        SET name = excluded.name, protected_by = excluded.protected_by,
            protected_at = excluded.protected_at;
    RETURN true;
END
$$;

CREATE FUNCTION pglease.protect(tbl regclass, name text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked text;
BEGIN
    PERFORM pglease._check_may_alter(tbl, 'protect');
    checked := pglease._check_text('name', protect.name);
    IF (SELECT c.relkind FROM pg_class AS c WHERE c.oid = tbl) IS DISTINCT FROM 'r' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'tbl',
            MESSAGE = format('pglease: tbl %s is not an ordinary table', tbl);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_inherits AS i WHERE i.inhrelid = tbl OR i.inhparent = tbl) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'tbl',
            MESSAGE = format('pglease: tbl %s is part of a partition or inheritance tree, '
                             'which protect does not cover', tbl);
    END IF;
    EXECUTE format('CREATE OR REPLACE TRIGGER pglease_protect BEFORE INSERT OR UPDATE OR DELETE ON %s '
                   'FOR EACH STATEMENT EXECUTE FUNCTION pglease._guard()', tbl);
    EXECUTE format('CREATE OR REPLACE TRIGGER pglease_protect_truncate BEFORE TRUNCATE ON %s '
                   'FOR EACH STATEMENT EXECUTE FUNCTION pglease._guard()', tbl);
    PERFORM pglease._bind(tbl, protect.name);
END
$$;

COMMENT ON FUNCTION pglease.protect(regclass, text) IS
    'Make table TBL reject INSERT, UPDATE, DELETE and TRUNCATE from transactions '
    'that do not hold lease NAME (declared with pglease.assert_held).';

CREATE FUNCTION pglease.unprotect(tbl regclass)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    was boolean;
BEGIN
    PERFORM pglease._check_may_alter(tbl, 'unprotect');
    was := EXISTS (SELECT 1 FROM pg_trigger AS t
                    WHERE t.tgrelid = tbl AND t.tgname = 'pglease_protect');
    EXECUTE format('DROP TRIGGER IF EXISTS pglease_protect ON %s', tbl);
    EXECUTE format('DROP TRIGGER IF EXISTS pglease_protect_truncate ON %s', tbl);
    RETURN pglease._bind(tbl, NULL) OR was;
END
$$;

COMMENT ON FUNCTION pglease.unprotect(regclass) IS
    'Remove the protection pglease.protect put on table TBL. Returns whether '
    'it was protected.';

-- Which tables are protected, by which lease (see pglease.protect), and
-- whether both guard triggers are as protect made them: BEFORE, for each
-- statement, pglease._guard, enabled, no WHEN clause, no column list
-- (tgtype 30: INSERT, DELETE, UPDATE; 34: TRUNCATE).
CREATE VIEW pglease.protected AS
SELECT p.tbl::regclass AS tbl, p.name,
       (SELECT count(*) FROM pg_trigger AS t
         WHERE t.tgrelid = p.tbl
           AND ((t.tgname = 'pglease_protect' AND t.tgtype = 30)
                OR (t.tgname = 'pglease_protect_truncate' AND t.tgtype = 34))
           AND t.tgfoid = 'pglease._guard()'::regprocedure
           AND t.tgenabled IN ('O', 'A') AND t.tgqual IS NULL AND t.tgattr = ''::int2vector)
           = 2 AS intact,
       p.protected_by, p.protected_at
  FROM pglease._protected AS p
  JOIN pg_class AS c ON c.oid = p.tbl;

COMMENT ON VIEW pglease.protected IS
    'Tables protected by pglease.protect, with their lease; intact is false when a guard '
    'trigger was dropped, disabled or replaced (then the table is not protected).';

------------------------------------------------------------------------
-- Declared sessions: a command's sessions that carry their lease.
------------------------------------------------------------------------

-- DECLARED SESSIONS. A session may declare, for its whole life, the lease
-- it acts under: the settings pglease.name and pglease.token, given when
-- it connects (PGOPTIONS='-c pglease.name=NAME -c pglease.token=T', or
-- the options of a URL; `pglease run --declare` gives them to every
-- session its command opens), so that a migration tool or a script is
-- fenced without a line of it changed. The declaration is a claim, never
-- a fact (any session can set those settings): each use of it is a call
-- of assert_held, which checks the token, the expiry on the database
-- clock and the session's role, and holds the check until commit. It is
-- used in two places only, so that a session that declares nothing pays
-- nothing:
--  - a protected table's guard, when the transaction declared no token
--    for the table's lease itself (_guard above);
--  - the DDL fence (opt-in, fence_ddl): each DDL command of a declared
--    session is checked as it starts; an undeclared session's DDL is not
--    checked at all.
-- A checked declared transaction is a fenced transaction: a takeover
-- ends it after FENCED_GRACE (see TAKEOVER FROM A FROZEN HOLDER).
--
-- A declared session can also pin the next holder outside any checked
-- transaction: a migration tool's own lock (sqlx's Migrator holds a
-- session-level advisory lock for its whole run; Liquibase keeps a lock
-- row) held by a deployer frozen between two migrations, or the row locks
-- of an unchecked transaction. So an acquisition that takes over a term
-- that ended without a release (it expired, or its holder's session
-- ended), and force_release, end the sessions of this database declared
-- under that term (_declared_pids, _end_declared), found two ways:
--  - by their SESSION MARKER: a session whose check under the term passed
--    holds, until it ends, a shared session-level advisory lock on a key
--    derived from the lease's secret, the term's token and its process id
--    (_session_marker; nobody without the secret can compute it, as with
--    the fenced marker);
--  - by their application_name, 'pglease:<token>' or 'pglease:<token> ...',
--    which `pglease run --declare` gives its command (PGAPPNAME): that finds
--    a session before its first check, as when a deployer froze right
--    after taking its tool's lock. It is a hint, never a fact: it is taken
--    only from sessions whose login role may act under the term's role
--    (another role's session would fail its first check anyway), and a
--    session can only name itself. Tokens are drawn from one sequence for
--    every lease, so a token names one term of one lease.
-- Each session is ended on its own, so that one the owner may not end
-- keeps nobody else's. Nothing is ended while the term it declared is
-- valid: these run only once that term has ended, under the row lock
-- that ends it.

-- The session marker of the session with process id PID checked under
-- term TOKEN of the lease with SECRET: as _marker, with a prefix that
-- keeps it apart from every transaction's marker. Per term: a session
-- that declares another term later (SET) is not ended with this one.
CREATE FUNCTION pglease._session_marker(secret bytea, token bigint, pid integer)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT ('x' || pg_catalog.encode(pg_catalog.substr(
               pg_catalog.sha256($1 || ('session ' || $2 || ' ' || $3)::bytea), 1, 8),
               'hex'))::bit(64)::bigint
$$;

-- A declared session's check, for lease LEASE: false when the session
-- declares no token for it (pglease.name is another lease, or unset);
-- otherwise assert_held under the declared token (22023 for a
-- pglease.token that is not a token), then the session marker, and true.
-- Called only by _guard and _fence_ddl, which run as the functions' owner
-- with a fixed search_path, so it needs no SECURITY DEFINER or SET of its
-- own (each would add its cost to every protected write of a declared
-- session).
CREATE FUNCTION pglease._check_session(lease text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    declared text;
BEGIN
    IF current_setting('pglease.name', true) IS DISTINCT FROM lease THEN
        RETURN false;
    END IF;
    declared := current_setting('pglease.token', true);
    IF declared IS NULL OR declared !~ '^[1-9][0-9]{0,18}$'
       OR declared::numeric > 9223372036854775807 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pglease: this session declares lease %L with pglease.token %L, '
                             'which is not a token (a positive whole number)', lease, declared);
    END IF;
    PERFORM pglease.assert_held(lease, declared::bigint);
    -- Shared and re-entrant: the same session's next check only counts
    -- it again. Nobody without the secret holds it exclusively; should
    -- it be held so all the same, the check fails rather than leave the
    -- session unmarked (as assert_held does with its own marker).
    IF NOT (SELECT pg_try_advisory_lock_shared(
                       pglease._session_marker(l.secret, declared::bigint, pg_backend_pid()))
              FROM pglease.leases AS l WHERE l.name = _check_session.lease) THEN
        RAISE EXCEPTION USING ERRCODE = '55P03',
            MESSAGE = format('pglease: lease %L: this session''s marker is held exclusively '
                             'by another session', lease);
    END IF;
    RETURN true;
END
$$;

REVOKE ALL ON FUNCTION pglease._check_session(text) FROM PUBLIC;

-- The DDL fence's event trigger (see fence_ddl): checks a declared
-- session's DDL command before it runs; returns at once for any other.
CREATE FUNCTION pglease._fence_ddl()
RETURNS event_trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lease text := nullif(current_setting('pglease.name', true), '');
BEGIN
    IF lease IS NOT NULL THEN
        PERFORM pglease._check_session(lease);
    END IF;
END
$$;

REVOKE ALL ON FUNCTION pglease._fence_ddl() FROM PUBLIC;

COMMENT ON FUNCTION pglease._fence_ddl() IS
    'Event trigger of the DDL fence (see pglease.fence_ddl): a declared session''s DDL '
    'command is checked as pglease.assert_held checks, before it runs.';

-- fence_ddl(true) turns the DDL fence on for this database: an event
-- trigger, pglease_fence_ddl, on ddl_command_start. fence_ddl(false)
-- turns it off. Returns whether it was on. Event triggers are the
-- superuser's (on managed services, the provider's administrator role,
-- such as rds_superuser, may create them); without it, 42501 says so, and
-- only protected tables fence declared sessions. An event trigger does
-- not fire for commands on objects shared by the whole server (databases,
-- roles, tablespaces), nor in single-user mode.
CREATE FUNCTION pglease.fence_ddl(fenced boolean)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    was boolean;
BEGIN
    IF fenced IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'fenced',
            MESSAGE = 'pglease: fenced must be true or false, got NULL';
    END IF;
    was := EXISTS (SELECT 1 FROM pg_event_trigger AS e WHERE e.evtname = 'pglease_fence_ddl');
    IF fenced AND NOT was THEN
        EXECUTE 'CREATE EVENT TRIGGER pglease_fence_ddl ON ddl_command_start '
                'EXECUTE FUNCTION pglease._fence_ddl()';
    ELSIF was AND NOT fenced THEN
        EXECUTE 'DROP EVENT TRIGGER pglease_fence_ddl';
    ELSIF was AND NOT pglease.ddl_fenced() THEN
        -- Disabled or replaced since: made as it should be.
        EXECUTE 'DROP EVENT TRIGGER pglease_fence_ddl';
        EXECUTE 'CREATE EVENT TRIGGER pglease_fence_ddl ON ddl_command_start '
                'EXECUTE FUNCTION pglease._fence_ddl()';
    END IF;
    RETURN was;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE EXCEPTION USING ERRCODE = '42501',
        MESSAGE = format('pglease: role %I may not turn the DDL fence %s: event triggers '
                         'are created and dropped by a superuser (on a managed service, '
                         'its administrator role, such as rds_superuser)', current_user,
                         CASE WHEN fenced THEN 'on' ELSE 'off' END),
        DETAIL = SQLERRM;
END
$$;

REVOKE ALL ON FUNCTION pglease.fence_ddl(boolean) FROM PUBLIC;

COMMENT ON FUNCTION pglease.fence_ddl(boolean) IS
    'Turn the DDL fence on (true) or off (false) for this database: each DDL command of '
    'a session that declares a lease (pglease.name, pglease.token) is checked as '
    'pglease.assert_held checks, before it runs. A superuser''s. Returns whether it was on.';

-- Whether the DDL fence is on and as fence_ddl made it: the event trigger
-- exists, fires (enabled for origin or always) on ddl_command_start, on
-- every command (no tag filter), and runs pglease._fence_ddl.
CREATE FUNCTION pglease.ddl_fenced()
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT EXISTS (SELECT 1 FROM pg_event_trigger AS e
                    WHERE e.evtname = 'pglease_fence_ddl' AND e.evtevent = 'ddl_command_start'
                      AND e.evtenabled IN ('O', 'A') AND e.evttags IS NULL
                      AND e.evtfoid = 'pglease._fence_ddl()'::regprocedure)
$$;

COMMENT ON FUNCTION pglease.ddl_fenced() IS
    'Whether the DDL fence (pglease.fence_ddl) is on and intact in this database.';

-- The version tables of the migration tools pglease knows, one row per
-- tool: protecting a tool's table for the deployers' lease makes a stale
-- deployer's migration transaction fail as it records itself (the tools
-- that record each migration in its own transaction). `pglease protect
-- --tool` and `pglease doctor` read this list (the library's copy,
-- pglease::migration_tools, is tested against it).
CREATE FUNCTION pglease.migration_tools()
RETURNS TABLE (tool text, version_table text)
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    VALUES ('sqlx', '_sqlx_migrations'),
           ('refinery', 'refinery_schema_history'),
           ('diesel', '__diesel_schema_migrations'),
           ('alembic', 'alembic_version'),
           ('flyway', 'flyway_schema_history'),
           ('golang-migrate', 'schema_migrations'),
           ('liquibase', 'databasechangelog')
$$;

-- The sessions in this database declared under term TOKEN of the lease
-- with SECRET, whose holder's role was ROLE (see DECLARED SESSIONS), and
-- how each was found: 'checked' (it holds the term's session marker) or
-- 'application_name' ('pglease:<TOKEN>', or that and a space first; only
-- sessions whose login role may act under ROLE: a name is a hint, and a
-- session of another role is refused at its first check anyway). The
-- activity snapshot is read afresh, so that no process id of an earlier
-- read, reused since, is taken.
CREATE FUNCTION pglease._declared_pids(secret bytea, token bigint, role name)
RETURNS TABLE (pid integer, found_by text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    db oid := (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database());
BEGIN
    PERFORM pg_stat_clear_snapshot();
    RETURN QUERY
    SELECT DISTINCT ON (f.pid) f.pid, f.found_by
      FROM (SELECT k.pid, 'checked' AS found_by
              FROM pg_locks AS k
             WHERE k.locktype = 'advisory' AND k.objsubid = 1 AND k.granted
               AND k.database = db AND k.pid <> pg_backend_pid()
               AND ((k.classid::bigint << 32) | k.objid::bigint)
                   = pglease._session_marker(_declared_pids.secret, _declared_pids.token, k.pid)
            UNION ALL
            SELECT a.pid, 'application_name'
              FROM pg_stat_get_activity(NULL) AS a
             WHERE a.datid = db AND a.pid <> pg_backend_pid()
               AND (a.application_name = 'pglease:' || _declared_pids.token
                    OR starts_with(a.application_name, 'pglease:' || _declared_pids.token || ' '))
               AND EXISTS (SELECT 1 FROM pg_roles AS r
                            WHERE r.rolname = _declared_pids.role
                              AND pg_has_role(a.usesysid, r.oid, 'MEMBER'))) AS f
     ORDER BY f.pid, f.found_by DESC;
END
$$;

-- (Callable by whoever may read pglease.declared, which calls it: it
-- finds nothing without a lease's secret, and ends nothing.)

-- Ends the sessions declared under lease NAME's term TOKEN, held by ROLE,
-- which has just ended (see DECLARED SESSIONS), each on its own: one that
-- the role that owns the functions may not end (a superuser's, or
-- another role's without pg_signal_backend) is named in a WARNING and
-- keeps nobody else's from being ended. Records the eviction. Internal:
-- it does not check that the term has ended, so nobody but the owner may
-- call it. The acquisition goes on either way: the next holder then
-- waits for what a session left open holds, as without declarations.
CREATE FUNCTION pglease._end_declared(name text, token bigint, role name)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    d      record;
    ended  text;
    kept   text;
BEGIN
    FOR d IN SELECT p.pid
               FROM pglease.leases AS l
              CROSS JOIN LATERAL pglease._declared_pids(l.secret, _end_declared.token,
                                                        _end_declared.role) AS p
              WHERE l.name = _end_declared.name
              ORDER BY p.pid LOOP
        BEGIN
            IF pg_terminate_backend(d.pid) THEN
                ended := concat_ws(', ', ended, d.pid);
            END IF;
        EXCEPTION WHEN insufficient_privilege THEN
            kept := concat_ws(', ', kept, d.pid);
        END;
    END LOOP;
    IF ended IS NOT NULL THEN
        PERFORM pglease._record(_end_declared.name, _end_declared.token, 'evicted', NULL,
                                clock_timestamp(), NULL, 'ended declared sessions ' || ended);
    END IF;
    IF kept IS NOT NULL THEN
        RAISE WARNING USING MESSAGE = format(
            'pglease: lease %L: sessions %s, declared under its ended token %s, are still '
            'open: role %I, which owns the pglease functions, may not end them; a superuser '
            'can allow it: GRANT pg_signal_backend TO %I (sessions of superusers only a '
            'superuser can end)', _end_declared.name, kept, _end_declared.token, current_user,
            current_user);
    END IF;
END
$$;

REVOKE ALL ON FUNCTION pglease._end_declared(text, bigint, name) FROM PUBLIC;

-- The sessions that declare a lease's current term (see DECLARED
-- SESSIONS), as far as others can see them: by the session marker of a
-- check under that term, or by their application_name. For people, like
-- pglease.fenced.
CREATE VIEW pglease.declared AS
SELECT l.name, d.pid, d.found_by
  FROM pglease.leases AS l
 CROSS JOIN LATERAL pglease._declared_pids(l.secret, l.token, l.role) AS d
 WHERE l.holder IS NOT NULL;

COMMENT ON VIEW pglease.declared IS
    'Sessions (pid) that declare a held lease''s current term: found by the marker a check '
    'under that term took, or by an application_name pglease:<token>. A takeover of a term '
    'that ended without a release ends the sessions declared under it.';

------------------------------------------------------------------------
-- admit(resource, token): separate-resource fencing.
------------------------------------------------------------------------

CREATE FUNCTION pglease.admit(resource text, token bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked       text;
    checked_token bigint;
    highest       bigint;
    accepted      boolean;
    here          pglease._checked;
BEGIN
    checked := pglease._check_text('resource', admit.resource);
    checked_token := pglease._check_token(admit.token);
    IF admit.token <= 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'token',
            MESSAGE = format('pglease: token must be positive, got %s', admit.token);
    END IF;

    -- Tokens are judged against a fence that has moved past a change of
    -- timeline, if there was one (see TIMELINES).
    IF pg_is_in_recovery() THEN
        PERFORM pglease._refuse_standby('admit a token to a high-water mark');
    END IF;
    SELECT * INTO here FROM pglease._checked;
    IF NOT FOUND THEN
        here := pglease._timeline_checked(NULL);
        IF here.timeline IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = '55P03',
                MESSAGE = 'pglease: another transaction checking the server''s timeline has '
                          'not committed for 1 s; try again';
        END IF;
    END IF;

    -- A token never issued would raise the mark above every real one.
    IF admit.token > (SELECT CASE WHEN q.is_called THEN q.last_value ELSE 0 END
                          FROM pglease.fence_seq AS q) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'token',
            MESSAGE = format('pglease: token %s has never been issued (the latest token issued '
                             'is %s)', admit.token,
                             (SELECT CASE WHEN q.is_called THEN q.last_value ELSE 0 END
                                FROM pglease.fence_seq AS q));
    END IF;

    -- A token drawn before the latest change of timeline is accepted only
    -- while its lease, valid at the change, is held under it: the mark
    -- itself may have gone back (see HIGH-WATER MARKS).
    IF admit.token <= here.floor
       AND NOT EXISTS (SELECT 1 FROM pglease._carried AS c
                         JOIN pglease.leases AS l ON l.name = c.name
                        WHERE c.token = admit.token AND l.token = admit.token
                          AND l.holder IS NOT NULL AND clock_timestamp() < l.expires_at) THEN
        RETURN false;
    END IF;

    -- Read-only answers when nothing would change.
    SELECT f.token INTO highest FROM pglease.fences AS f WHERE f.resource = admit.resource;
    IF FOUND AND highest > admit.token THEN
        RETURN false;
    END IF;
    IF FOUND AND highest = admit.token THEN
        RETURN true;
    END IF;

    -- A high-water mark that went backwards after a crash would accept an
    -- old token again: this commit must be durable.
    IF current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    INSERT INTO pglease.fences AS f (resource, token, advanced_at)
    VALUES (admit.resource, admit.token, clock_timestamp())
    ON CONFLICT ON CONSTRAINT fences_pkey DO UPDATE
        SET token = excluded.token, advanced_at = excluded.advanced_at
        WHERE f.token <= excluded.token
    RETURNING true INTO accepted;
    RETURN coalesce(accepted, false);
END
$$;

COMMENT ON FUNCTION pglease.admit(text, bigint) IS
    'Separate-resource fencing: accept TOKEN for RESOURCE iff it is >= the highest '
    'token accepted so far, and record it. Returns true if accepted; a token never '
    'issued is an error (22023). After a change of timeline (pglease.timelines), a token '
    'drawn before it is accepted only while its lease is held under it.';

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
    checked   text;
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
    IF current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
        checked := set_config('synchronous_commit', 'on', true);
    END IF;
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

-- =====================================================================
-- 5. A VALUE PER LEASE
--
-- The holder of a lease may publish a small value with it (its address,
-- say, so that others find the leader): set at acquisition (the library
-- sends acquire and set_value in one statement) or later under the token,
-- read by anyone through the status view. A value belongs to the
-- acquisition that set it (value_token): the next acquisition starts
-- without one, at no cost to an acquisition that sets none, and a value
-- stays readable after its lease is released or expires, until then.
-- =====================================================================

------------------------------------------------------------------------
-- set_value(name, token, value): publish a value under a valid token.
------------------------------------------------------------------------

-- Like renew, keyed on (name, token) and decided with clock_timestamp() at
-- the row update, so a stale holder cannot publish over its successor.
-- NULL clears the value.
CREATE FUNCTION pglease.set_value(name text, token bigint, value text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked text;
    done    record;
BEGIN
    IF NOT coalesce(octet_length(set_value.name) BETWEEN 1 AND pglease._max_text_bytes()
                    AND set_value.token IS NOT NULL, false) THEN
        checked := pglease._check_text('name', set_value.name);
        PERFORM pglease._check_token(set_value.token);
    END IF;
    IF octet_length(set_value.value) > pglease._max_value_bytes() THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'value',
            MESSAGE = format('pglease: value is %s bytes long; the limit is %s bytes of UTF-8',
                             octet_length(set_value.value), pglease._max_value_bytes());
    END IF;

    -- Whether it changes anything, from the row as this statement found it.
    UPDATE pglease.leases AS l
       SET value = set_value.value,
           value_token = set_value.token,
           value_changes = CASE WHEN l.value_token = set_value.token
                                THEN l.value_changes + 1 ELSE 1 END
      FROM pglease.leases AS o
     WHERE l.name = set_value.name
       AND o.name = set_value.name
       AND l.token = set_value.token
       AND l.holder IS NOT NULL
       AND clock_timestamp() < l.expires_at
       AND (l.role = session_user OR pglease._may_act(l.role))
    RETURNING o.value IS DISTINCT FROM l.value OR o.value_token IS DISTINCT FROM l.value_token
              AS changed, l.holder, l.value_changes INTO done;
    IF NOT FOUND THEN
        PERFORM pglease._refuse_foreign(set_value.name, set_value.token, 'publish a value under');
        RETURN false; -- stale token, released, expired or unknown
    END IF;
    IF done.changed THEN
        -- The history: the first 16 values of a term, their first 1,000
        -- characters.
        IF done.value_changes <= 16 THEN
            PERFORM pglease._record(set_value.name, set_value.token, 'value', done.holder,
                                    clock_timestamp(), NULL, left(set_value.value, 1000));
        END IF;
        PERFORM pglease._changed(set_value.name);
    END IF;
    RETURN true;
END
$$;

COMMENT ON FUNCTION pglease.set_value(text, bigint, text) IS
    'Publish VALUE (at most 8 KiB; NULL clears it) with lease NAME held under '
    'TOKEN, readable by anyone in pglease.status. Returns false, changing '
    'nothing, if the lease is lost (stale token, released, expired).';

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
    IF current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
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
    IF current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
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

-- =====================================================================
-- 8. COUNTED LEASES: A NAME THAT UP TO N HOLDERS MAY HOLD AT ONCE
--
-- SLOTS. Slot k (1 to N) of counted lease NAME is the ordinary lease named
-- NAME || '#' || k: acquire_counted tries the slots in order and acquires
-- the first that is free or ended, with acquire itself. So each holder has
-- its own token and expiry, and everything else is what a lease has:
-- renew, release, set_value, assert_held and protected tables by the
-- slot's name and token, bounded takeover of an ended slot (also from a
-- frozen holder inside a fenced transaction), history and observation.
-- The slots are visible as such in pglease.status, and the name itself
-- as "k of n slots" (n: the limit its latest acquisition passed).
--
-- THE LIMIT is the caller's: N bounds nothing once passed. Every caller
-- of one name must pass the same N; a caller that passes a larger one may
-- use the slots above the others' limit. The latest N is kept in
-- _counted, for the status view and force_release only (written when it
-- changes). A failed attempt is otherwise read-only (each held slot is
-- reported by acquire's fast path); it answers the slot that expires
-- first, so that a waiter knows when to try again.
-- =====================================================================

-- The latest limit passed for each counted lease name, so that the status
-- view can say "k of n slots": written by acquire_counted only when it
-- differs (a read of one row otherwise). A fact for display and for
-- force_release, which ends slots 1 to N; never a bound on acquisitions.
CREATE TABLE pglease._counted (
    name  pglease.bounded_text NOT NULL PRIMARY KEY,
    slots integer              NOT NULL
);

REVOKE ALL ON pglease._counted FROM PUBLIC;

CREATE FUNCTION pglease.acquire_counted(name text, slots integer, holder text, ttl interval,
                                        session_bound boolean DEFAULT false)
RETURNS pglease.counted_acquisition
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked text;
    got     pglease.acquisition;
    first   pglease.acquisition;
    first_k integer;
    slot    text;
    prior   text;
BEGIN
    IF acquire_counted.slots IS NULL OR acquire_counted.slots NOT BETWEEN 1 AND pglease._max_slots() THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'slots',
            MESSAGE = format('pglease: slots must be between 1 and %s, got %s',
                             pglease._max_slots(), coalesce(acquire_counted.slots::text, 'NULL'));
    END IF;
    checked := pglease._check_text('name', acquire_counted.name);
    IF octet_length(format('%s#%s', acquire_counted.name, acquire_counted.slots))
       > pglease._max_text_bytes() THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'name',
            MESSAGE = format('pglease: name is %s bytes long; with its slot suffix (#%s) a '
                             'counted lease name may be at most %s bytes of UTF-8',
                             octet_length(acquire_counted.name), acquire_counted.slots,
                             pglease._max_text_bytes()
                             - octet_length(format('#%s', acquire_counted.slots)));
    END IF;
    IF NOT pg_is_in_recovery() AND NOT EXISTS (
           SELECT 1 FROM pglease._counted AS c
            WHERE c.name = acquire_counted.name AND c.slots = acquire_counted.slots) THEN
        -- For the status view and force_release only: never wait long
        -- for another transaction writing the same name's row (this
        -- acquisition would wait without bound behind it, and two
        -- transactions writing two names in opposite orders would
        -- deadlock). Skipped then; a later acquisition writes it.
        prior := current_setting('lock_timeout');
        PERFORM set_config('lock_timeout', '50ms', true);
        BEGIN
            INSERT INTO pglease._counted AS c (name, slots)
            VALUES (acquire_counted.name, acquire_counted.slots)
            ON CONFLICT ON CONSTRAINT _counted_pkey DO UPDATE SET slots = EXCLUDED.slots
             WHERE c.slots <> EXCLUDED.slots;
        EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
            NULL;
        END;
        PERFORM set_config('lock_timeout', prior, true);
    END IF;
    FOR k IN 1 .. acquire_counted.slots LOOP
        slot := format('%s#%s', acquire_counted.name, k);
        got := pglease.acquire(slot, acquire_counted.holder, acquire_counted.ttl,
                               acquire_counted.session_bound);
        IF got.token IS NOT NULL THEN
            RETURN ROW(got.token, got.expires_at, got.holder, got.checked_at, got.note, slot,
                       got.holder_session, NULL)::pglease.counted_acquisition;
        END IF;
        -- The grant delay holds for every slot (see TIMELINES).
        IF got.delayed_until IS NOT NULL THEN
            RETURN ROW(NULL, got.expires_at, got.holder, got.checked_at, got.note, slot,
                       got.holder_session, got.delayed_until)::pglease.counted_acquisition;
        END IF;
        IF first IS NULL OR got.expires_at < first.expires_at THEN
            first := got;
            first_k := k;
        END IF;
    END LOOP;
    RETURN ROW(NULL, first.expires_at, first.holder, first.checked_at, first.note,
               format('%s#%s', acquire_counted.name, first_k), first.holder_session, NULL)
           ::pglease.counted_acquisition;
END
$$;

COMMENT ON FUNCTION pglease.acquire_counted(text, integer, text, interval, boolean) IS
    'Acquire one of SLOTS slots of counted lease NAME (slot k is the lease NAME#k) for '
    'HOLDER for TTL (SESSION_BOUND as for acquire): the first free or ended one, as acquire '
    'would. Returns one row (token, expires_at, holder, checked_at, note, slot_name, '
    'holder_session, delayed_until); token is NULL when every '
    'slot is held, and then the row describes the slot that expires first. Use the slot''s '
    'name with the token for renew, release and assert_held.';

-- =====================================================================
-- 9. THE SECURITY POSTURE, FOR `pglease doctor`
-- =====================================================================

-- One row per finding: level ('ok', 'warn' or 'info'), topic, and a
-- sentence. SECURITY DEFINER, to read the bindings and grants; it shows
-- nothing a role with USAGE on the schema could not learn from the
-- catalogs, but the names of protected tables' leases and name grants.
CREATE FUNCTION pglease.audit()
RETURNS TABLE (level text, topic text, message text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r record;
    n bigint;
BEGIN
    -- Who may call the functions at all: USAGE on the schema.
    IF has_schema_privilege('public', 'pglease', 'USAGE') THEN
        RETURN QUERY SELECT 'warn', 'schema',
            'PUBLIC has USAGE on schema pglease: every role that can connect may take leases; '
            'REVOKE USAGE ON SCHEMA pglease FROM PUBLIC and grant it to the application roles';
    END IF;
    SELECT string_agg(quote_ident(a.rolname), ', ' ORDER BY a.rolname), count(*) INTO r
      FROM pg_roles AS a
     WHERE NOT a.rolsuper AND a.rolname !~ '^pg_'
       AND has_schema_privilege(a.oid, 'pglease', 'USAGE')
       AND NOT pg_has_role(a.oid, current_user, 'MEMBER');
    RETURN QUERY SELECT 'info', 'schema',
        format('roles that may use pglease (USAGE on the schema): %s', coalesce(r.string_agg, 'none but its owner'));
    -- The administrators' functions check is_admin() themselves; EXECUTE
    -- on force_release is granted to pglease_admin only.
    IF has_function_privilege('public', 'pglease.force_release(text, text)', 'EXECUTE') THEN
        RETURN QUERY SELECT 'warn', 'functions',
            'PUBLIC has EXECUTE on pglease.force_release (it still checks that the caller is '
            'an administrator): REVOKE EXECUTE ON FUNCTION pglease.force_release(text, text) '
            'FROM PUBLIC';
    END IF;
    -- Administrators.
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pglease_admin') THEN
        SELECT string_agg(quote_ident(m.rolname), ', ' ORDER BY m.rolname) INTO r
          FROM pg_auth_members AS am
          JOIN pg_roles AS g ON g.oid = am.roleid AND g.rolname = 'pglease_admin'
          JOIN pg_roles AS m ON m.oid = am.member;
        RETURN QUERY SELECT 'info', 'administrators',
            format('superusers, members of %I (the owner), and members of pglease_admin: %s',
                   current_user, coalesce(r.string_agg, 'none'));
    ELSE
        RETURN QUERY SELECT 'warn', 'administrators',
            format('role pglease_admin does not exist: only superusers and members of %I are '
                   'pglease administrators (CREATE ROLE pglease_admin NOLOGIN, then migrate again)',
                   current_user);
    END IF;
    -- Ending stale fenced sessions.
    IF pglease.can_end_stale_transactions() THEN
        RETURN QUERY SELECT 'ok', 'takeover',
            format('role %I, which owns the functions, may end stale fenced sessions', current_user);
    ELSE
        RETURN QUERY SELECT 'warn', 'takeover',
            format('role %I, which owns the functions, may not end stale fenced sessions: '
                   'GRANT pg_signal_backend TO %I', current_user, current_user);
    END IF;
    -- Name grants.
    SELECT count(*) INTO n FROM pglease.name_grants;
    IF n = 0 THEN
        RETURN QUERY SELECT 'info', 'names',
            'no names are granted by prefix: every role that may use pglease may acquire any name';
    ELSE
        FOR r IN SELECT g.prefix, string_agg(quote_ident(g.role), ', ' ORDER BY g.role) AS roles,
                        bool_and(EXISTS (SELECT 1 FROM pg_roles AS x WHERE x.rolname = g.role)) AS exist
                   FROM pglease.name_grants AS g GROUP BY g.prefix ORDER BY g.prefix LOOP
            RETURN QUERY SELECT CASE WHEN r.exist THEN 'info' ELSE 'warn' END, 'names',
                format('names under %L: %s%s', r.prefix, r.roles,
                       CASE WHEN r.exist THEN '' ELSE ' (a granted role no longer exists)' END);
        END LOOP;
    END IF;
    -- Protected tables.
    FOR r IN SELECT p.tbl, p.name, p.intact FROM pglease.protected AS p ORDER BY p.tbl::text LOOP
        IF NOT r.intact THEN
            RETURN QUERY SELECT 'warn', 'protected',
                format('table %s is NOT protected any more: a guard trigger was dropped, disabled '
                       'or replaced; its owner should run pglease.protect(%L, %L) again',
                       r.tbl, r.tbl::text, r.name);
        END IF;
        RETURN QUERY
        SELECT 'warn', 'protected',
               format('role %I holds TRIGGER on protected table %s and may replace its guard '
                      'triggers: REVOKE TRIGGER ON %s FROM %I (grant SELECT, INSERT, UPDATE, '
                      'DELETE only)', g.rolname, r.tbl, r.tbl, g.rolname)
          FROM pg_class AS c
         CROSS JOIN LATERAL aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) AS x
          JOIN pg_roles AS g ON g.oid = x.grantee
         WHERE c.oid = r.tbl AND x.privilege_type = 'TRIGGER' AND x.grantee <> c.relowner;
        IF has_table_privilege('public', r.tbl, 'TRIGGER') THEN
            RETURN QUERY SELECT 'warn', 'protected',
                format('PUBLIC holds TRIGGER on protected table %s: REVOKE TRIGGER ON %s FROM PUBLIC',
                       r.tbl, r.tbl);
        END IF;
    END LOOP;
    -- What fences declared sessions (see DECLARED SESSIONS): per lease,
    -- its protected tables and the DDL fence; a migration tool's version
    -- table left unprotected.
    FOR r IN SELECT p.name, string_agg(p.tbl::text, ', ' ORDER BY p.tbl::text) AS tables
               FROM pglease.protected AS p GROUP BY p.name ORDER BY p.name LOOP
        RETURN QUERY SELECT 'info', 'fences',
            format('lease %L fences tables %s; its declared sessions'' DDL %s', r.name, r.tables,
                   CASE WHEN pglease.ddl_fenced() THEN 'is fenced (the database''s DDL fence)'
                        ELSE 'is not fenced' END);
    END LOOP;
    RETURN QUERY SELECT 'info', 'fences',
        CASE WHEN pglease.ddl_fenced()
             THEN 'the DDL fence is on: each DDL command of a session that declares a lease '
                  'is checked under its token'
             ELSE 'the DDL fence is off: a session that declares a lease is checked only as '
                  'it writes a protected table, not at its DDL (a superuser turns the fence on: '
                  'pglease.fence_ddl(true))'
        END;
    RETURN QUERY
    SELECT 'warn', 'fences',
           format('table %s, by its name %s''s version table, is not protected: a deployer '
                  'frozen past its lease''s TTL can still commit its migration; its owner runs '
                  'pglease protect --tool %s --lease NAME (or pglease.protect(%L, NAME))',
                  c.oid::regclass, t.tool, t.tool, c.oid::regclass::text)
      FROM pglease.migration_tools() AS t
      JOIN pg_class AS c ON c.relname = t.version_table AND c.relkind = 'r'
      JOIN pg_namespace AS n ON n.oid = c.relnamespace AND n.nspname <> 'pglease'
     WHERE NOT EXISTS (SELECT 1 FROM pglease._protected AS p WHERE p.tbl = c.oid)
     ORDER BY c.oid::regclass::text;
    -- The time a frozen transaction that no fence sees keeps its locks.
    IF EXISTS (SELECT 1 FROM pglease._protected)
       AND current_setting('idle_in_transaction_session_timeout') IN ('0', '0ms') THEN
        RETURN QUERY SELECT 'info', 'fences',
            'idle_in_transaction_session_timeout is off: a frozen transaction that wrote only '
            'unprotected tables is ended by the next holder''s takeover only when its session '
            'declared the lease; otherwise it keeps its locks until it resumes. Bound it for '
            'the roles that run migrations and jobs (ALTER ROLE ... SET '
            'idle_in_transaction_session_timeout = ''5min'')';
    END IF;
    -- The history.
    RETURN QUERY SELECT 'info', 'history',
        format('history kept for %s, at most about %s rows (pglease.set_history)',
               c.retention, c.max_rows)
      FROM pglease._history_config AS c;
END
$$;

COMMENT ON FUNCTION pglease.audit() IS
    'The security posture, one finding per row (level ok/warn/info, topic, message): who '
    'may use the schema, who administers, whether stale fenced sessions can be ended, '
    'name grants, protected tables (intact, roles holding TRIGGER), the history''s bounds.';

-- =====================================================================
-- 10. SEVERAL LEASES AT ONCE: ALL OR NONE
-- =====================================================================
--
-- acquire_all takes every lease of a set, each with its own token, or none.
-- It checks every name, and whether the caller may use it (see
-- AUTHORITY), before anything is taken; checks the server's timeline as
-- acquire does, outside what a refusal undoes (so that a refused set does
-- not undo the check, nor start a grant delay again); then sorts the
-- names (byte order, COLLATE "C": the same order in every session
-- whatever its locale) and acquires them one by one with acquire, in one
-- subtransaction: the first name it cannot take rolls back the ones
-- already taken (their rows, history and notifications; the tokens drawn
-- are never issued, so the fence sequence skips them), and the answer
-- describes that name. What a refusal does not undo: stale fenced
-- sessions that a takeover of an earlier name ended stay ended (their
-- eviction is not recorded). Once every name is taken, every lease gets
-- the same expiry, a full TTL from the end of the call, so that a set
-- whose names took long to take is not answered already expired (nobody
-- else sees the rows before the commit). Sets are not session-bound.
--
-- No deadlock: acquire never queues for a row lock (see NO WAIT WITHOUT
-- BOUND), so two acquire_all calls over overlapping names, in whatever
-- order their callers list them, never wait on each other beyond
-- TAKEOVER_GRACE per name: the later one finds the first contended name
-- held, or still being taken by the other's open transaction (then, after
-- the grace, "not acquired" with a note that a transaction is open), and
-- answers for it. The canonical order makes the first contended name the
-- same for both, so one of them gets the whole set. Sets of names never
-- used before may also contend on the creators' slots (a hash of the
-- name): the later one then answers "not acquired" after 1 s.

CREATE FUNCTION pglease._max_set_names()
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 100 $$;

COMMENT ON FUNCTION pglease._max_set_names() IS
    'How many names acquire_all takes at once, at most.';

-- A set's names, checked (1 to _max_set_names() distinct names, each a
-- valid name this session may use; 22023 or 42501 otherwise) and sorted
-- in byte order. ACTION names the operation in a refusal.
CREATE FUNCTION pglease._check_names(names text[], action text)
RETURNS text[]
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    sorted text[];
    n      text;
BEGIN
    IF array_ndims(_check_names.names) > 1 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'names',
            MESSAGE = format('pglease: names must be a list (an array of one dimension), got %s '
                             'dimensions', array_ndims(_check_names.names));
    END IF;
    IF _check_names.names IS NULL
       OR coalesce(cardinality(_check_names.names), 0) NOT BETWEEN 1 AND pglease._max_set_names() THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'names',
            MESSAGE = format('pglease: names must hold 1 to %s names, got %s',
                             pglease._max_set_names(),
                             coalesce(cardinality(_check_names.names)::text, 'NULL'));
    END IF;
    IF array_position(_check_names.names, NULL) IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'names',
            MESSAGE = 'pglease: names must not contain NULL';
    END IF;
    SELECT array_agg(d.n ORDER BY d.n COLLATE "C") INTO sorted
      FROM (SELECT DISTINCT u.n FROM unnest(_check_names.names) AS u(n)) AS d;
    IF cardinality(sorted) <> cardinality(_check_names.names) THEN
        SELECT u.n INTO n FROM unnest(_check_names.names) AS u(n)
         GROUP BY u.n HAVING count(*) > 1 ORDER BY u.n COLLATE "C" LIMIT 1;
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'names',
            MESSAGE = format('pglease: names must differ, %L is there twice', n);
    END IF;
    FOREACH n IN ARRAY sorted LOOP
        PERFORM pglease._check_text('name', n);
        IF NOT pglease._may_use_name(n) THEN
            PERFORM pglease._refuse_name(n, _check_names.action);
        END IF;
    END LOOP;
    RETURN sorted;
END
$$;

REVOKE ALL ON FUNCTION pglease._check_names(text[], text) FROM PUBLIC;

-- Result of acquire_all, one row per name: acquire's answer and the name.
CREATE TYPE pglease.set_acquisition AS (
    name           text,
    token          bigint,
    expires_at     timestamptz,
    holder         text,
    checked_at     timestamptz,
    note           text,
    holder_session integer,
    delayed_until  timestamptz,
    ahead          integer,
    -- As acquire's: the name is served first come, first served, and the
    -- set, refused on it, should join the lines of its names.
    fair           boolean
);

CREATE FUNCTION pglease.acquire_all(names text[], holder text, ttl interval,
                                    ticket bigint DEFAULT NULL)
RETURNS SETOF pglease.set_acquisition
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    sorted  text[];
    got     pglease.acquisition;
    taken   pglease.acquisition[] := '{}';
    missing text;
    expiry  timestamptz;
BEGIN
    -- Every name, and whether the caller may use it, before anything is
    -- taken (acquire checks the holder and the TTL on the first name).
    sorted := pglease._check_names(acquire_all.names, 'acquire');
    -- The server's timeline, checked where a refusal does not undo it.
    IF NOT pg_is_in_recovery() AND NOT EXISTS (SELECT 1 FROM pglease._checked) THEN
        PERFORM pglease._timeline_checked(NULL);
    END IF;
    -- The set's places in line, kept for another TTL where a refusal does
    -- not undo it (see LINES).
    IF acquire_all.ticket IS NOT NULL AND NOT pg_is_in_recovery() THEN
        FOREACH missing IN ARRAY sorted LOOP
            PERFORM pglease._ahead(missing, acquire_all.ticket, acquire_all.ttl);
        END LOOP;
    END IF;
    BEGIN
        FOREACH missing IN ARRAY sorted LOOP
            got := pglease.acquire(missing, acquire_all.holder, acquire_all.ttl, false,
                                   acquire_all.ticket);
            IF got.token IS NULL THEN
                -- Undo the ones taken: the handler below rolls this
                -- subtransaction back.
                RAISE EXCEPTION USING ERRCODE = 'LE099';
            END IF;
            taken := taken || got;
        END LOOP;
        -- One expiry for the set, a full TTL from now (see above).
        expiry := clock_timestamp()
                  + make_interval(secs => extract(epoch FROM acquire_all.ttl)::double precision);
        UPDATE pglease.leases AS l SET expires_at = expiry WHERE l.name = ANY (sorted);
    EXCEPTION WHEN SQLSTATE 'LE099' THEN
        -- missing and got describe the name that could not be taken.
        RETURN NEXT ROW(missing, NULL, got.expires_at, got.holder, got.checked_at, got.note,
                        got.holder_session, got.delayed_until, got.ahead,
                        got.fair)::pglease.set_acquisition;
        RETURN;
    END;
    RETURN QUERY SELECT sorted[i], taken[i].token, l.expires_at, taken[i].holder,
                        taken[i].checked_at, taken[i].note, taken[i].holder_session,
                        taken[i].delayed_until, taken[i].ahead, taken[i].fair
                   FROM generate_subscripts(sorted, 1) AS i
                   JOIN pglease.leases AS l ON l.name = sorted[i]
                  ORDER BY i;
END
$$;

COMMENT ON FUNCTION pglease.acquire_all(text[], text, interval, bigint) IS
    'Acquire every lease of NAMES (1 to 100 distinct names) for HOLDER for TTL, each with '
    'its own token and the same expiry, or none; 42501 before anything if the caller may '
    'not use one of the names. The names are taken in byte order (COLLATE "C"), each as '
    'acquire would; the first that cannot be taken undoes the others. Returns one row per '
    'name in that order (name, token, expires_at, '
    'holder, checked_at, note, holder_session, delayed_until) when all were acquired; '
    'otherwise one row, token NULL, describing the first name that could not be taken. '
    'TICKET: the set''s place in line (see enqueue), kept for another TTL on every name. '
    'Renew the set with renew_many and release it in one transaction.';

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
-- marks it then). Answers "held" by the shared holder that expires last,
-- until that expiry or for 2 s, whichever ends first (not after
-- checked_at if they have just ended: the caller goes on). AHEAD as
-- acquire answers it. Internal to acquire.
CREATE FUNCTION pglease._writer_waits(name text, holder text, ahead integer, waits boolean)
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
    RETURN ROW(NULL, until, reader, clock_timestamp(), NULL, NULL, NULL,
               _writer_waits.ahead, NULL)::pglease.acquisition;
END
$$;

REVOKE ALL ON FUNCTION pglease._writer_waits(text, text, integer, boolean) FROM PUBLIC;

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
    IF current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
        checked := set_config('synchronous_commit', 'on', true);
    END IF;
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
    note     text;
    t        timestamptz;
    new_token bigint;
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
    IF pg_is_in_recovery() THEN
        PERFORM pglease._refuse_standby('hand over a lease');
    END IF;
    -- It draws a token: as acquire, not before the timeline is checked and
    -- not in a grant delay (see TIMELINES).
    note := (pglease._no_grant_now('hand_over')).why;
    IF note IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '55P03',
            MESSAGE = format('pglease: cannot hand lease %L over now: %s; release it instead',
                             hand_over.name, note);
    END IF;

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

    -- The row, FOR UPDATE, once the holder's open fenced transactions have
    -- ended (as by force_release).
    lease := pglease._lock_to_end(hand_over.name, hand_over.token, 'hand over');
    t := clock_timestamp();
    IF lease.name IS NULL OR lease.token <> hand_over.token OR lease.holder IS NULL
       OR t >= lease.expires_at
       OR (lease.session_pid IS NOT NULL
           AND pglease._session_gone(lease.session_pid, lease.session_start)) THEN
        RAISE EXCEPTION USING ERRCODE = 'LE001',
            MESSAGE = format('pglease: lease %L is not held under token %s: only a valid '
                             'lease can be handed over', hand_over.name, hand_over.token),
            DETAIL = format('reason=not_held token=%s name=%s', hand_over.token, hand_over.name);
    END IF;
    IF lease.role IS DISTINCT FROM session_user AND NOT pglease._may_act(lease.role) THEN
        PERFORM pglease._refuse_owner(hand_over.name, lease.role, 'hand over');
    END IF;

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

    new_token := nextval('pglease.fence_seq');
    UPDATE pglease.leases AS l
       SET holder = hand_over.successor,
           role = place.role,
           token = new_token,
           expires_at = clock_timestamp() + make_interval(secs => seconds::double precision),
           acquired_at = clock_timestamp(),
           renewed_at = NULL,
           released_at = NULL,
           renewals = 0,
           session_pid = NULL,
           session_start = NULL,
           handed_to = place.ticket
     WHERE l.name = hand_over.name;
    DELETE FROM pglease._line AS q WHERE q.ticket = place.ticket;
    -- Durable whatever the session's synchronous_commit (see DURABILITY).
    IF current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
        checked := set_config('synchronous_commit', 'on', true);
    END IF;
    PERFORM pglease._record(hand_over.name, hand_over.token, 'released', lease.holder,
                            clock_timestamp(), lease.renewals,
                            format('handed over to %s', hand_over.successor));
    PERFORM pglease._record(hand_over.name, new_token, 'acquired', hand_over.successor,
                            clock_timestamp(), NULL,
                            format('handed over by %s', lease.holder));
    -- Wakes the successor at commit (rare enough to notify whether or not
    -- anyone watches).
    PERFORM pg_notify('pglease_release', hashtext(hand_over.name)::text);
    PERFORM pglease._changed(hand_over.name);
    RETURN new_token;
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

-- =====================================================================
-- 14. ONE PICTURE OF A NAME, WHOEVER HOLDS IT
--
-- STATUS. One row per lease name ever acquired, of every kind. KIND says
-- who holds it now, on the database clock:
--   'exclusive'  one holder: holder, token, expires_at, remaining;
--   'shared'     READERS valid shared holders, the last of them expiring
--                at READERS_UNTIL (each one in view shared);
--   'counted'    a counted lease name (part 8): SLOTS_HELD of its SLOTS
--                slots valid; each slot is also a row of its own, NAME#k;
--   'free'       nobody.
-- FAIR and WAITING: the name's line (see LINES), live places only. The
-- columns before KIND are the exclusive term's, as they always were:
-- held is true only while an exclusive holder holds the name. The counts
-- are scalar subqueries over one name's rows; readers and readers_until
-- are dropped by the planner when a query does not select them, waiting
-- is not (it calls a volatile function) but costs nothing for a name
-- without a line (queued false). No acquisition, renewal or release
-- reads this view; failure paths and status do.
-- =====================================================================

CREATE VIEW pglease.status AS
SELECT l.name::text AS name,
       l.holder::text AS holder,
       nullif(l.token, 0) AS token,
       l.expires_at,
       CASE WHEN v.held THEN l.expires_at - c.t END AS remaining,
       v.held,
       CASE WHEN l.value_token = l.token THEN l.value::text END AS value,
       CASE WHEN l.step_down_token = l.token AND v.held
            THEN l.step_down_by END AS step_down_requested_by,
       CASE WHEN l.step_down_token = l.token AND v.held
            THEN l.step_down_at END AS step_down_requested_at,
       l.renewals,
       -- A session-bound lease (see SESSION-BOUND LEASES): the process id
       -- of its session, and whether that session has ended (the lease
       -- then is not held, though its expiry has not come).
       CASE WHEN l.holder IS NOT NULL THEN l.session_pid END AS holder_session,
       coalesce(v.ended, false) AS session_ended,
       CASE WHEN v.held THEN 'exclusive'
            WHEN EXISTS (SELECT 1 FROM pglease._shared AS s
                          WHERE s.name = l.name AND s.expires_at > c.t) THEN 'shared'
            ELSE 'free' END AS kind,
       (SELECT count(*)::integer FROM pglease._shared AS s
         WHERE s.name = l.name AND s.expires_at > c.t) AS readers,
       (SELECT max(s.expires_at) FROM pglease._shared AS s
         WHERE s.name = l.name AND s.expires_at > c.t) AS readers_until,
       NULL::integer AS slots,
       NULL::integer AS slots_held,
       l.fair,
       CASE WHEN l.queued THEN (SELECT count(*)::integer FROM pglease._line AS p
                                 WHERE p.name = l.name AND pglease._place_lives(p))
            ELSE 0 END AS waiting
  FROM pglease.leases AS l
 CROSS JOIN LATERAL (SELECT clock_timestamp() AS t) AS c
 CROSS JOIN LATERAL (SELECT l.holder IS NOT NULL AND c.t < l.expires_at AND l.session_pid IS NOT NULL
                            AND pglease._session_gone(l.session_pid, l.session_start) AS ended) AS e
 CROSS JOIN LATERAL (SELECT l.holder IS NOT NULL AND c.t < l.expires_at
                            AND NOT coalesce(e.ended, false) AS held,
                            e.ended) AS v
 -- Acquired exclusive (a token drawn) or shared (readers_after set) at
 -- least once; a row created by a refused first attempt is not shown.
 WHERE l.token > 0 OR l.readers_after IS NOT NULL
UNION ALL
-- Typed as the columns above, so that the planner flattens the union
-- (and so computes no column a query does not select).
SELECT n.name::text, NULL::text, NULL::bigint, x.expires_at, NULL::interval, false,
       NULL::text, NULL::text, NULL::timestamptz, 0, NULL::integer, false,
       CASE WHEN x.held > 0 THEN 'counted' ELSE 'free' END, 0, NULL::timestamptz, n.slots,
       x.held, false, 0
  FROM pglease._counted AS n
 CROSS JOIN LATERAL (SELECT clock_timestamp() AS t) AS c
 -- The slots, 1 to the latest limit: how many are held, and until when
 -- the last of them (or, with none held, the last that was) runs.
 CROSS JOIN LATERAL (
       SELECT coalesce(count(*) FILTER (WHERE h.valid), 0)::integer AS held,
              coalesce(max(h.expires_at) FILTER (WHERE h.valid), max(h.expires_at)) AS expires_at
         FROM (SELECT s.expires_at,
                      s.holder IS NOT NULL AND c.t < s.expires_at
                      AND NOT (s.session_pid IS NOT NULL
                               AND pglease._session_gone(s.session_pid, s.session_start)) AS valid
                 FROM pglease.leases AS s
                WHERE s.name = ANY (ARRAY(SELECT format('%s#%s', n.name, k)
                                            FROM generate_series(1, n.slots) AS k))
                  AND s.token > 0) AS h) AS x
 -- A name used both ways is shown once, as the lease it also is.
 WHERE NOT EXISTS (SELECT 1 FROM pglease.leases AS o
                    WHERE o.name = n.name AND (o.token > 0 OR o.readers_after IS NOT NULL));

COMMENT ON VIEW pglease.status IS
    'One row per lease name ever acquired, of every kind. kind: exclusive, shared, counted '
    'or free, now (database clock). holder, token, expires_at, remaining, held, value, '
    'step_down_requested_by/_at, renewals, holder_session and session_ended describe the '
    'exclusive term (held: an exclusive holder holds it; holder is NULL once released); '
    'readers and readers_until the valid shared holders (each in pglease.shared); slots '
    'and slots_held a counted lease name (slots: the limit its latest acquisition passed; '
    'slot k is the row NAME#k); fair and waiting its line (live places).';

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pglease_admin') THEN
        GRANT SELECT ON pglease.status TO pglease_admin;
    END IF;
END
$$;
