-- the minimal correct guarded write, raw: token and expiry checked on the lease
-- row, locked FOR KEY SHARE until commit, and the UPDATE, one statement.
\set n random(1, :names)
\set tok :n + :roff
WITH fence AS (SELECT 1 FROM raw_leases
                WHERE name = 'held-' || :n AND token = :tok AND clock_timestamp() < expires_at
                  FOR KEY SHARE)
UPDATE data SET value = value + 1 FROM fence WHERE id = :n;
