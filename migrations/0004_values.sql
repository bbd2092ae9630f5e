-- pglease: a value per lease.
--
-- The holder of a lease may publish a small value with it (its address,
-- say, so that others find the leader): set at acquisition (the library
-- sends acquire and proclaim in one statement) or later under the token,
-- read by anyone through the status view. A value belongs to the
-- acquisition that set it (value_token): the next acquisition starts
-- without one, at no cost to an acquisition that sets none, and a value
-- stays readable after its lease is released or expires, until then.
--
-- The CLOCK, LOCKS, DURABILITY and PRIVILEGES rules of 0001_schema.sql
-- apply to every function here.

-- value: at most this many bytes of UTF-8 (8 KiB).
CREATE FUNCTION pglease._max_value_bytes()
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 8192 $$;

ALTER TABLE pglease.leases
    ADD COLUMN value       text CHECK (octet_length(value) <= pglease._max_value_bytes()),
    ADD COLUMN value_token bigint;

COMMENT ON COLUMN pglease.leases.value IS
    'The value published by the holder of token value_token (pglease.proclaim).';

CREATE OR REPLACE VIEW pglease.status AS
SELECT l.name,
       l.holder,
       l.token,
       l.expires_at,
       CASE WHEN l.holder IS NOT NULL AND c.t < l.expires_at
            THEN l.expires_at - c.t END AS remaining,
       (l.holder IS NOT NULL AND c.t < l.expires_at) AS held,
       CASE WHEN l.value_token = l.token THEN l.value END AS value
  FROM pglease.leases AS l
 CROSS JOIN LATERAL (SELECT clock_timestamp() AS t) AS c
 WHERE l.token > 0;

COMMENT ON VIEW pglease.status IS
    'One row per lease name ever acquired; holder is NULL once released, '
    'remaining is NULL unless held, held uses the database clock; value is the '
    'one the latest acquisition published (NULL if none).';

------------------------------------------------------------------------
-- proclaim(name, token, value): publish a value under a valid token.
------------------------------------------------------------------------

-- Like renew, keyed on (name, token) and decided with clock_timestamp() at
-- the row update, so a stale holder cannot publish over its successor.
-- NULL clears the value.
CREATE FUNCTION pglease.proclaim(name text, token bigint, value text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked text;
BEGIN
    IF NOT coalesce(octet_length(proclaim.name) BETWEEN 1 AND pglease._max_text_bytes()
                    AND proclaim.token IS NOT NULL, false) THEN
        checked := pglease._check_text('name', proclaim.name);
        PERFORM pglease._check_token(proclaim.token);
    END IF;
    IF octet_length(proclaim.value) > pglease._max_value_bytes() THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'value',
            MESSAGE = format('pglease: value is %s bytes long; the limit is %s bytes of UTF-8',
                             octet_length(proclaim.value), pglease._max_value_bytes());
    END IF;

    UPDATE pglease.leases AS l
       SET value = proclaim.value,
           value_token = proclaim.token
     WHERE l.name = proclaim.name
       AND l.token = proclaim.token
       AND l.holder IS NOT NULL
       AND clock_timestamp() < l.expires_at;
    RETURN FOUND; -- false: stale token, released, expired or unknown
END
$$;

COMMENT ON FUNCTION pglease.proclaim(text, bigint, text) IS
    'Publish VALUE (at most 8 KiB; NULL clears it) with lease NAME held under '
    'TOKEN, readable by anyone in pglease.status. Returns false, changing '
    'nothing, if the lease is lost (stale token, released, expired).';
