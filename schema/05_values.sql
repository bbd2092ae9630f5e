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

-- LATER PARTS. Used here, defined in a later part (PL/pgSQL looks a
-- name up when a function runs, not when it is created): 7: _changed,
-- _record.

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
