-- a guarded write in one statement: the check (held to commit) and the UPDATE.
\set n random(1, :names)
\set tok :n + :off
WITH fence AS (SELECT pglease.assert_held('held-' || :n, :tok))
UPDATE data SET value = value + 1 FROM fence WHERE id = :n;
