-- the minimal correct fenced transaction, raw: token and expiry checked on the
-- lease row, locked FOR KEY SHARE until commit, the write, COMMIT.
\set n random(1, :names)
\set tok :n + :roff
BEGIN;
SELECT 1 FROM raw_leases
 WHERE name = 'held-' || :n AND token = :tok AND clock_timestamp() < expires_at
   FOR KEY SHARE;
UPDATE data SET value = value + 1 WHERE id = :n;
COMMIT;
