-- P8: the declared write alone, in autocommit, in a session that declared
-- held-1 when it connected.
UPDATE data SET value = value + 1 WHERE id = :client_id + 1;
