-- P8's baseline in one statement: the check (held to commit) and the
-- write to the protected table.
\set tok 1 + :off
WITH fence AS (SELECT pglease.assert_held('held-1', :tok))
UPDATE data SET value = value + 1 FROM fence WHERE id = :client_id + 1;
