-- P8 in one statement: the write alone, in a declared session.
UPDATE data SET value = value + 1 WHERE id = :client_id + 1;
