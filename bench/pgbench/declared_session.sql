-- P8: the same write in a session that declared held-1 when it connected
-- (PGOPTIONS='-c pglease.name=held-1 -c pglease.token=...'): no
-- assert_held in the transaction; the table's guard checks the session's
-- declaration.
BEGIN;
UPDATE data SET value = value + 1 WHERE id = :client_id + 1;
COMMIT;
