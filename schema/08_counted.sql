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
