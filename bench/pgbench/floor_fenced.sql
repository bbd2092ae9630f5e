-- a fenced transaction, the floor: raw_fenced's check (the lease row FOR
-- KEY SHARE until commit) inside a SECURITY DEFINER function (setup.sql),
-- the write, COMMIT.
\set n random(1, :names)
\set tok :n + :roff
BEGIN;
SELECT floor.guard('held-' || :n, :tok);
UPDATE data SET value = value + 1 WHERE id = :n;
COMMIT;
