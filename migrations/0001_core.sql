-- pglease core schema: leases with fencing tokens, enforced by PostgreSQL.
--
-- Vocabulary: a lease has a name (the resource), a holder (who), a token
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
--
-- TTLs are converted to an exact number of seconds before they are added,
-- so '1 day' is always 86400 s and never depends on the session's TimeZone
-- (a calendar day across a DST change is 23 or 25 hours).
--
-- LOCKS. acquire changes the token, and (name, token) is a unique key, so
-- the update is a *key* update and needs the FOR UPDATE row lock.
-- assert_held takes FOR KEY SHARE, which conflicts only with FOR UPDATE:
-- while a fenced transaction is open no acquisition of its lease can
-- commit, but renew and release (which change no key column) proceed.
--
-- DURABILITY. A token once handed out is never handed out again, whatever
-- synchronous_commit is: acquire and advance raise synchronous_commit to
-- 'on' for their own transaction when it is weaker (with asynchronous
-- commit a crash could roll back both the lease row and the sequence and
-- issue the same token twice; with a synchronous standby, 'on' also waits
-- for the standby). renew and release keep the caller's setting: losing one
-- in a crash makes a lease end earlier or later than its holder believes,
-- but can never reissue a token, and guarded writes are checked against the
-- row that survived.

CREATE SCHEMA IF NOT EXISTS pglease;

COMMENT ON SCHEMA pglease IS
    'Leases with fencing tokens enforced by PostgreSQL (see the pglease README).';

-- Tokens for every lease come from one sequence: strictly increasing in the
-- order they are drawn, never reused. CACHE 1 so that no session keeps a
-- private block of values; NO CYCLE so that it can never wrap around.
CREATE SEQUENCE pglease.fence_seq AS bigint START WITH 1 INCREMENT BY 1 CACHE 1 NO CYCLE;

-- One row per lease name, created on the first acquisition and never
-- deleted: deleting and recreating a row could let a racing acquirer lock a
-- row that is no longer current.
CREATE TABLE pglease.leases (
    name        text        NOT NULL PRIMARY KEY
                            CHECK (octet_length(name) BETWEEN 1 AND 255),
    -- NULL once released; after expiry it still names the last holder.
    holder      text        CHECK (holder IS NULL OR octet_length(holder) BETWEEN 1 AND 255),
    -- The latest token issued for this name (0 only inside the transaction
    -- that creates the row).
    token       bigint      NOT NULL,
    expires_at  timestamptz NOT NULL,
    acquired_at timestamptz NOT NULL,
    renewed_at  timestamptz,
    released_at timestamptz,
    -- Makes "token" a key column: see LOCKS above.
    CONSTRAINT leases_name_token_key UNIQUE (name, token)
) WITH (fillfactor = 80); -- room for HOT updates by renew and release

COMMENT ON TABLE pglease.leases IS
    'One row per lease name; change it only through the pglease functions.';

-- Separate-resource fencing: the highest token each resource has accepted.
CREATE TABLE pglease.fences (
    resource    text        NOT NULL PRIMARY KEY
                            CHECK (octet_length(resource) BETWEEN 1 AND 255),
    token       bigint      NOT NULL,
    advanced_at timestamptz NOT NULL
);

COMMENT ON TABLE pglease.fences IS
    'High-water mark of accepted tokens per separate resource (pglease.advance).';

REVOKE ALL ON pglease.leases, pglease.fences, pglease.fence_seq FROM PUBLIC;

-- Result of acquire. When the lease was not acquired, token is NULL and
-- expires_at/holder describe the current holder.
CREATE TYPE pglease.acquisition AS (
    token      bigint,
    expires_at timestamptz,
    holder     text,
    checked_at timestamptz  -- the database time the decision was made at
);

------------------------------------------------------------------------
-- Input validation: SQLSTATE 22023 (invalid_parameter_value), message
-- naming the argument, raised before anything is read or written.
------------------------------------------------------------------------

-- The helpers use only built-in functions (pg_catalog is always searched
-- first) and carry no SET clause, so that calling them stays cheap. They
-- return their argument so that callers can use them in an assignment,
-- which PL/pgSQL evaluates without going through SPI.
CREATE FUNCTION pglease._check_text(argument text, value text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pglease: %s must not be NULL', argument);
    END IF;
    IF octet_length(value) = 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pglease: %s must not be empty', argument);
    END IF;
    IF octet_length(value) > 255 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pglease: %s is %s bytes long; the limit is 255 bytes of UTF-8',
                             argument, octet_length(value));
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
        RAISE EXCEPTION USING ERRCODE = '22023',
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
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'pglease: ttl must not be NULL';
    END IF;
    seconds := extract(epoch FROM ttl);
    IF seconds <= 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pglease: ttl must be greater than zero, got %s', ttl);
    END IF;
    IF seconds > 604800 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pglease: ttl must be at most 7 days, got %s', ttl);
    END IF;
    RETURN make_interval(secs => seconds::double precision);
END
$$;

-- Acquisitions must be durable whatever the session's synchronous_commit
-- (see DURABILITY above). set_config(..., true) lasts until the end of the
-- caller's transaction, so it governs that transaction's commit.
CREATE FUNCTION pglease._durable_commit()
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
END
$$;

------------------------------------------------------------------------
-- acquire(name, holder, ttl): acquire if free or expired.
------------------------------------------------------------------------

CREATE FUNCTION pglease.acquire(name text, holder text, ttl interval)
RETURNS pglease.acquisition
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked   text;
    exact_ttl interval;
    cur       pglease.leases%ROWTYPE;
    found_row boolean;
    t         timestamptz;
    result    pglease.acquisition;
BEGIN
    checked := pglease._check_text('name', acquire.name);
    checked := pglease._check_text('holder', acquire.holder);
    exact_ttl := pglease._check_ttl(acquire.ttl);

    -- Fast path, read-only: a lease that is held and unexpired is reported
    -- without a row lock, a token, WAL or a commit flush (failed attempts
    -- on a hot name cost nothing but a read). An unexpired lease is not
    -- re-entrant, also for its own holder.
    SELECT * INTO cur FROM pglease.leases AS l WHERE l.name = acquire.name;
    found_row := FOUND;
    t := clock_timestamp();
    IF found_row AND cur.holder IS NOT NULL AND t < cur.expires_at THEN
        RETURN ROW(NULL, cur.expires_at, cur.holder, t)::pglease.acquisition;
    END IF;

    IF NOT found_row THEN
        -- First acquisition of this name: create the row with token 0.
        -- Creators of one name take turns (a transaction-level advisory
        -- lock on the name's hash, in pglease's own key space 0x706c6561):
        -- two speculative inserts racing on the primary key, followed by
        -- the winner's key update (which inserts a new primary-key entry),
        -- can otherwise deadlock. The second creator then finds the
        -- committed row, inserts nothing, and locks that row below.
        PERFORM pg_advisory_xact_lock(1886152033, hashtext(acquire.name));
        INSERT INTO pglease.leases AS l (name, holder, token, expires_at, acquired_at)
        VALUES (acquire.name, NULL, 0, '-infinity', clock_timestamp())
        ON CONFLICT ON CONSTRAINT leases_pkey DO NOTHING;
    END IF;

    -- Slow path: lock the row (waits for a concurrent acquirer, and for
    -- fenced transactions that still hold FOR KEY SHARE on it), then
    -- decide again on the latest row version and a fresh clock reading.
    SELECT * INTO cur FROM pglease.leases AS l WHERE l.name = acquire.name FOR UPDATE;
    t := clock_timestamp();
    IF cur.holder IS NOT NULL AND t < cur.expires_at THEN
        RETURN ROW(NULL, cur.expires_at, cur.holder, t)::pglease.acquisition;
    END IF;

    PERFORM pglease._durable_commit();
    -- The token is drawn only now, while this transaction holds the row
    -- lock: for each name, tokens strictly increase in commit order.
    UPDATE pglease.leases AS l
       SET holder = acquire.holder,
           token = nextval('pglease.fence_seq'),
           expires_at = t + exact_ttl,
           acquired_at = t,
           renewed_at = NULL,
           released_at = NULL
     WHERE l.name = acquire.name
    RETURNING l.token, l.expires_at INTO result.token, result.expires_at;
    result.holder := acquire.holder;
    result.checked_at := t;
    RETURN result;
END
$$;

COMMENT ON FUNCTION pglease.acquire(text, text, interval) IS
    'Acquire lease NAME for HOLDER for TTL if it is free or expired. Returns '
    '(token, expires_at, holder, checked_at); token is NULL when not acquired, '
    'and then expires_at and holder describe the current holder.';

------------------------------------------------------------------------
-- renew(name, token, ttl): extend a valid lease to database-now + ttl.
------------------------------------------------------------------------

CREATE FUNCTION pglease.renew(name text, token bigint, ttl interval)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked       text;
    checked_token bigint;
    exact_ttl     interval;
    new_expiry    timestamptz;
BEGIN
    checked := pglease._check_text('name', renew.name);
    checked_token := pglease._check_token(renew.token);
    exact_ttl := pglease._check_ttl(renew.ttl);

    -- clock_timestamp() in the WHERE clause is evaluated again if the
    -- update has to wait for a concurrent acquirer, so the check is made
    -- against the time the row is actually changed.
    UPDATE pglease.leases AS l
       SET expires_at = clock_timestamp() + exact_ttl,
           renewed_at = clock_timestamp()
     WHERE l.name = renew.name
       AND l.token = renew.token
       AND l.holder IS NOT NULL
       AND clock_timestamp() < l.expires_at
    RETURNING l.expires_at INTO new_expiry;
    RETURN new_expiry; -- NULL: stale token, released, expired or unknown
END
$$;

COMMENT ON FUNCTION pglease.renew(text, bigint, interval) IS
    'Extend lease NAME held under TOKEN to database-now + TTL. Returns the new '
    'expires_at, or NULL if the lease is lost (stale token, released, expired).';

------------------------------------------------------------------------
-- release(name, token): end a valid lease at once.
------------------------------------------------------------------------

CREATE FUNCTION pglease.release(name text, token bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked       text;
    checked_token bigint;
BEGIN
    checked := pglease._check_text('name', release.name);
    checked_token := pglease._check_token(release.token);

    -- Keyed on the token, not the holder name: a delayed or duplicated
    -- release from an earlier acquisition by the same holder matches
    -- nothing. After expiry the lease had already ended: nothing changes.
    UPDATE pglease.leases AS l
       SET holder = NULL,
           expires_at = clock_timestamp(),
           released_at = clock_timestamp()
     WHERE l.name = release.name
       AND l.token = release.token
       AND l.holder IS NOT NULL
       AND clock_timestamp() < l.expires_at;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- Wakes waiting acquirers (LISTEN pglease_release; the payload is the
    -- name). Delivered at commit, and only if the release commits: nobody
    -- hears of a release that did not happen.
    PERFORM pg_notify('pglease_release', release.name);
    RETURN true;
END
$$;

COMMENT ON FUNCTION pglease.release(text, bigint) IS
    'End lease NAME held under TOKEN at once, and notify channel pglease_release '
    'with the name. Returns true if this call ended it, false if it was not '
    'valid (stale token, already released, expired).';

------------------------------------------------------------------------
-- assert_held(name, token): the guarded-write check.
------------------------------------------------------------------------

CREATE FUNCTION pglease.assert_held(name text, token bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked       text;
    checked_token bigint;
    cur           pglease.leases%ROWTYPE;
    t             timestamptz;
BEGIN
    checked := pglease._check_text('name', assert_held.name);
    checked_token := pglease._check_token(assert_held.token);

    -- FOR KEY SHARE lasts until the caller's transaction ends and blocks
    -- the key update every acquisition makes: no other acquisition of this
    -- name can commit between this check and the caller's commit.
    SELECT * INTO cur FROM pglease.leases AS l WHERE l.name = assert_held.name FOR KEY SHARE;
    -- The clock is read after the lock is held (see CLOCK above).
    t := clock_timestamp();
    IF NOT FOUND OR cur.token = 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'LE001',
            MESSAGE = format('pglease: lease %L is not held: it has never been acquired',
                             assert_held.name);
    END IF;
    IF cur.token <> assert_held.token THEN
        RAISE EXCEPTION USING ERRCODE = 'LE001',
            MESSAGE = format('pglease: lease %L is not held under token %s: %s',
                             assert_held.name, assert_held.token,
                             CASE WHEN assert_held.token < cur.token
                                  THEN format('the token is stale, the lease was acquired again with token %s', cur.token)
                                  ELSE 'no such token has been issued for this lease' END);
    END IF;
    IF cur.holder IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'LE001',
            MESSAGE = format('pglease: lease %L is not held under token %s: it was released at %s',
                             assert_held.name, assert_held.token, cur.released_at);
    END IF;
    IF t >= cur.expires_at THEN
        RAISE EXCEPTION USING ERRCODE = 'LE001',
            MESSAGE = format('pglease: lease %L is not held under token %s: it expired at %s (database time now %s)',
                             assert_held.name, assert_held.token, cur.expires_at, t);
    END IF;

    -- Record the declaration for the rest of the transaction (protected
    -- tables read it): a JSON object mapping lease name to token.
    checked := set_config('pglease.declared',
        (coalesce(nullif(current_setting('pglease.declared', true), ''), '{}')::jsonb
            || jsonb_build_object(assert_held.name, assert_held.token))::text,
        true);
END
$$;

COMMENT ON FUNCTION pglease.assert_held(text, bigint) IS
    'Inside a transaction: fail with SQLSTATE LE001 unless lease NAME is valid '
    'under TOKEN, and keep any other acquisition of NAME from committing until '
    'this transaction ends. Records the declaration for protected tables.';

------------------------------------------------------------------------
-- advance(resource, token): separate-resource fencing.
------------------------------------------------------------------------

CREATE FUNCTION pglease.advance(resource text, token bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked       text;
    checked_token bigint;
    highest       bigint;
    accepted      boolean;
BEGIN
    checked := pglease._check_text('resource', advance.resource);
    checked_token := pglease._check_token(advance.token);
    IF advance.token <= 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pglease: token must be positive, got %s', advance.token);
    END IF;

    -- Read-only answers when nothing would change.
    SELECT f.token INTO highest FROM pglease.fences AS f WHERE f.resource = advance.resource;
    IF FOUND AND highest > advance.token THEN
        RETURN false;
    END IF;
    IF FOUND AND highest = advance.token THEN
        RETURN true;
    END IF;

    -- A high-water mark that went backwards after a crash would accept an
    -- old token again: this commit must be durable.
    PERFORM pglease._durable_commit();
    INSERT INTO pglease.fences AS f (resource, token, advanced_at)
    VALUES (advance.resource, advance.token, clock_timestamp())
    ON CONFLICT ON CONSTRAINT fences_pkey DO UPDATE
        SET token = excluded.token, advanced_at = excluded.advanced_at
        WHERE f.token <= excluded.token
    RETURNING true INTO accepted;
    RETURN coalesce(accepted, false);
END
$$;

COMMENT ON FUNCTION pglease.advance(text, bigint) IS
    'Separate-resource fencing: accept TOKEN for RESOURCE iff it is >= the highest '
    'token accepted so far, and record it. Returns true if accepted.';

------------------------------------------------------------------------
-- status: one row per name ever acquired.
------------------------------------------------------------------------

CREATE VIEW pglease.status AS
SELECT l.name,
       l.holder,
       l.token,
       l.expires_at,
       CASE WHEN l.holder IS NOT NULL AND c.t < l.expires_at
            THEN l.expires_at - c.t END AS remaining,
       (l.holder IS NOT NULL AND c.t < l.expires_at) AS held
  FROM pglease.leases AS l
 CROSS JOIN LATERAL (SELECT clock_timestamp() AS t) AS c
 WHERE l.token > 0;

COMMENT ON VIEW pglease.status IS
    'One row per lease name ever acquired; holder is NULL once released, '
    'remaining is NULL unless held, held uses the database clock.';
