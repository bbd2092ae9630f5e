-- a transaction that writes one row, unguarded.
\set n random(1, :names)
BEGIN;
UPDATE data SET value = value + 1 WHERE id = :n;
COMMIT;
