-- a guarded write in one statement, the floor: raw_write's check (the
-- lease row FOR KEY SHARE until commit) inside a SECURITY DEFINER
-- function (setup.sql), and the UPDATE.
\set n random(1, :names)
\set tok :n + :roff
WITH fence AS (SELECT 1 WHERE floor.guard('held-' || :n, :tok))
UPDATE data SET value = value + 1 FROM fence WHERE id = :n;
