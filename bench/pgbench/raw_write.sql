-- an unguarded write: the UPDATE alone.
\set n random(1, :names)
UPDATE data SET value = value + 1 WHERE id = :n;
