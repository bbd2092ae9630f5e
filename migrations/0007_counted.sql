-- pglease: counted leases, a name that up to N holders may hold at once.
--
-- SLOTS. Slot k (1 to N) of counted lease NAME is the ordinary lease named
-- NAME || '#' || k: acquire_counted tries the slots in order and acquires
-- the first that is free or ended, with acquire itself. So each holder has
-- its own token and expiry, and everything else is what a lease has:
-- renew, release, proclaim, assert_held and protected tables by the
-- slot's name and token, bounded takeover of an ended slot (also from a
-- frozen holder inside a fenced transaction), history and observation.
-- The slots are visible as such in pglease.status.
--
-- THE LIMIT is the caller's: N is not stored. Every caller of one name
-- must pass the same N; a caller that passes a larger one may use the
-- slots above the others' limit. A failed attempt is read-only (each held
-- slot is reported by acquire's fast path); it answers the slot that
-- expires first, so that a waiter knows when to try again.
--
-- The CLOCK, LOCKS, DURABILITY and PRIVILEGES rules of 0001_schema.sql
-- apply to every function here.

-- The most slots one counted lease may have.
CREATE FUNCTION pglease._max_slots()
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 1000 $$;

-- acquire's answer, and the slot it concerns.
CREATE TYPE pglease.counted_acquisition AS (
    token      bigint,
    expires_at timestamptz,
    holder     text,
    checked_at timestamptz,
    note       text,
    slot_name  text
);

CREATE FUNCTION pglease.acquire_counted(name text, slots integer, holder text, ttl interval)
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
    FOR k IN 1 .. acquire_counted.slots LOOP
        slot := format('%s#%s', acquire_counted.name, k);
        got := pglease.acquire(slot, acquire_counted.holder, acquire_counted.ttl);
        IF got.token IS NOT NULL THEN
            RETURN ROW(got.token, got.expires_at, got.holder, got.checked_at, got.note, slot)
                   ::pglease.counted_acquisition;
        END IF;
        IF first IS NULL OR got.expires_at < first.expires_at THEN
            first := got;
            first_k := k;
        END IF;
    END LOOP;
    RETURN ROW(NULL, first.expires_at, first.holder, first.checked_at, first.note,
               format('%s#%s', acquire_counted.name, first_k))::pglease.counted_acquisition;
END
$$;

COMMENT ON FUNCTION pglease.acquire_counted(text, integer, text, interval) IS
    'Acquire one of SLOTS slots of counted lease NAME (slot k is the lease NAME#k) for '
    'HOLDER for TTL: the first free or ended one, as acquire would. Returns one row '
    '(token, expires_at, holder, checked_at, note, slot_name); token is NULL when every '
    'slot is held, and then the row describes the slot that expires first. Use the slot''s '
    'name with the token for renew, release and assert_held.';
