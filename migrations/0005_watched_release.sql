-- pglease: release notifies only when somebody waits.
--
-- PostgreSQL serialises the commits of transactions that NOTIFY (they take
-- a database-wide lock held through their commit record's flush), so a
-- release that always notified could not share a WAL flush with any other
-- notifying commit. In this project's benchmark (examples/bench.rs), an
-- acquire+release cycle of bare statements ran at 2,800/s at 8 clients
-- with a notification and 4,800/s without one.
--
-- A waiter now says that it waits: pglease.watch(name) takes a shared
-- session-level advisory lock on (1886156641, hashtext(name)) (key space
-- 0x706c7761, "plwa"), on the connection that LISTENs. release tries the
-- exclusive transaction-level lock on the same key after it has ended the
-- lease: if a watcher holds the shared lock, the try fails and release
-- notifies as before. If nobody watches, release holds the exclusive lock
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
-- release notifies without asking, as it always did before.

------------------------------------------------------------------------
-- watch(name) / unwatch(name)
------------------------------------------------------------------------

CREATE FUNCTION pglease.watch(name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked text;
BEGIN
    IF NOT coalesce(octet_length(watch.name) BETWEEN 1 AND 255, false) THEN
        checked := pglease._check_text('name', watch.name);
    END IF;
    RETURN pg_try_advisory_lock_shared(1886156641, hashtext(watch.name));
END
$$;

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
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET client_min_messages = error
AS $$
DECLARE
    checked text;
BEGIN
    IF NOT coalesce(octet_length(unwatch.name) BETWEEN 1 AND 255, false) THEN
        checked := pglease._check_text('name', unwatch.name);
    END IF;
    RETURN pg_advisory_unlock_shared(1886156641, hashtext(unwatch.name));
END
$$;

COMMENT ON FUNCTION pglease.unwatch(text) IS
    'Undo one watch(NAME) of this session. Returns false if this session did not watch NAME.';

------------------------------------------------------------------------
-- release(name, token): validated with one combined test, as the
-- functions of 0004_lean_checks.sql are, and notifying only watched names.
------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION pglease.release(name text, token bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked text;
    locks   integer;
BEGIN
    IF NOT coalesce(octet_length(release.name) BETWEEN 1 AND 255
                    AND release.token IS NOT NULL, false) THEN
        checked := pglease._check_text('name', release.name);
        PERFORM pglease._check_token(release.token);
    END IF;

    -- Keyed on the token: a delayed release from an earlier acquisition
    -- matches nothing; after expiry nothing changes.
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
    -- Wakes watching waiters at commit (see the top of this file). Without
    -- watchers the exclusive lock is kept until commit, so that no watch
    -- can start in between; past 32 such locks, notify regardless.
    locks := coalesce(nullif(current_setting('pglease.release_locks', true), ''), '0')::integer;
    IF locks >= 32 THEN
        PERFORM pg_notify('pglease_release', release.name);
    ELSIF pg_try_advisory_xact_lock(1886156641, hashtext(release.name)) THEN
        checked := set_config('pglease.release_locks', (locks + 1)::text, true);
    ELSE
        PERFORM pg_notify('pglease_release', release.name);
    END IF;
    RETURN true;
END
$$;

COMMENT ON FUNCTION pglease.release(text, bigint) IS
    'End lease NAME held under TOKEN at once; if a session watches NAME '
    '(pglease.watch), notify channel pglease_release with the name. Returns true '
    'if this call ended it, false if it was not valid (stale token, already '
    'released, expired).';
