-- P8's baseline: a write to a protected table (data, protected by lease
-- held-1) in a transaction that declares its token itself.
\set tok 1 + :off
BEGIN;
SELECT pglease.assert_held('held-1', :tok);
UPDATE data SET value = value + 1 WHERE id = :client_id + 1;
COMMIT;
