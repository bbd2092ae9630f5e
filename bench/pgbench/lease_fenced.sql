-- a fenced transaction: the check (held to commit), the write, COMMIT.
\set n random(1, :names)
\set tok :n + :off
BEGIN;
SELECT pglease.assert_held('held-' || :n, :tok);
UPDATE data SET value = value + 1 WHERE id = :n;
COMMIT;
