-- pglease: holding leases over time.
--
-- renew_many renews many leases in one statement and one commit, so that a
-- process holding a thousand leases pays one round trip per renewal tick,
-- not a thousand. (Waiting acquirers are woken by the notification that
-- release sends, see 0001_core.sql.)
--
-- The CLOCK, LOCKS and DURABILITY rules of 0001_core.sql apply unchanged:
-- renew_many decides with clock_timestamp() at each row update, takes the
-- same row lock as renew, and keeps the caller's synchronous_commit.

------------------------------------------------------------------------
-- renew_many(names, tokens, ttls): renew[i] = renew(names[i], tokens[i], ttls[i])
------------------------------------------------------------------------

-- One row per lease renewed, with renewed = true and the new expires_at,
-- then one row per element not renewed, with renewed = false and the
-- current_token and current_holder of the row as found (current_token NULL:
-- the name was never acquired), so that the caller can tell a takeover from
-- a release or an expiry. A name may appear more than once: only elements
-- with the current token are renewed, and equal elements renew the lease
-- once (and yield one row).
CREATE FUNCTION pglease.renew_many(names text[], tokens bigint[], ttls interval[])
RETURNS TABLE (name text, token bigint, expires_at timestamptz, renewed boolean,
               current_token bigint, current_holder text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    bad        record;
    checked    text;
    r_names    text[];
    r_tokens   bigint[];
    r_expiries timestamptz[];
BEGIN
    IF names IS NULL OR tokens IS NULL OR ttls IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'pglease: names, tokens and ttls must not be NULL';
    END IF;
    IF cardinality(names) <> cardinality(tokens) OR cardinality(names) <> cardinality(ttls) THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pglease: names, tokens and ttls must have the same length, got %s, %s and %s',
                             cardinality(names), cardinality(tokens), cardinality(ttls));
    END IF;

    -- Validation is set-based (one scan of the arguments, in double
    -- precision rather than numeric); only the first bad element goes
    -- through the scalar checks, for their exact message.
    SELECT u.ord, u.n, u.t, u.ttl INTO bad
      FROM unnest(names, tokens, ttls) WITH ORDINALITY AS u(n, t, ttl, ord)
     WHERE u.n IS NULL OR octet_length(u.n) NOT BETWEEN 1 AND 255
        OR u.t IS NULL OR u.ttl IS NULL
        OR date_part('epoch', u.ttl) <= 0 OR date_part('epoch', u.ttl) > 604800
     ORDER BY u.ord
     LIMIT 1;
    IF FOUND THEN
        BEGIN
            checked := pglease._check_text('name', bad.n);
            PERFORM pglease._check_token(bad.t);
            PERFORM pglease._check_ttl(bad.ttl);
        EXCEPTION WHEN invalid_parameter_value THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = replace(SQLERRM, 'pglease: ', format('pglease: element %s: ', bad.ord));
        END;
    END IF;

    -- One UPDATE for the whole batch, with the same condition as renew and
    -- the TTL in exact seconds; it is joined on the primary key. What it
    -- renewed is kept, to tell the rest apart exactly.
    WITH upd AS (
        UPDATE pglease.leases AS l
           SET expires_at = clock_timestamp() + make_interval(secs => date_part('epoch', u.ttl)),
               renewed_at = clock_timestamp()
          FROM unnest(names, tokens, ttls) AS u(n, t, ttl)
         WHERE l.name = u.n
           AND l.token = u.t
           AND l.holder IS NOT NULL
           AND clock_timestamp() < l.expires_at
        RETURNING l.name, l.token, l.expires_at
    )
    SELECT coalesce(array_agg(upd.name), '{}'), coalesce(array_agg(upd.token), '{}'),
           coalesce(array_agg(upd.expires_at), '{}')
      INTO r_names, r_tokens, r_expiries
      FROM upd;
    RETURN QUERY
    SELECT r.n, r.t, r.e, true, NULL::bigint, NULL::text
      FROM unnest(r_names, r_tokens, r_expiries) AS r(n, t, e);

    -- Usually every lease was renewed and this is skipped. Otherwise: every
    -- element not among those renewed, with its lease's current row.
    IF cardinality(r_names) < cardinality(names) THEN
        RETURN QUERY
        SELECT u.n, u.t, NULL::timestamptz, false, nullif(c.token, 0), c.holder
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
    'token and holder).';
