-- pglease: protected tables.
--
-- protect(tbl, name) makes a table reject every INSERT (including COPY),
-- UPDATE, DELETE and TRUNCATE from a transaction that does not hold lease
-- NAME with a current, unexpired token; unprotect(tbl) undoes it. Code that
-- ignores the lease altogether is rejected, not only stale tokens.
--
-- A transaction declares its token with pglease.assert_held(name, token),
-- which records it in the transaction-local setting pglease.declared. A
-- write to a protected table without a declaration fails with SQLSTATE
-- LE002. With one, the trigger calls assert_held again: the token must
-- still be current and the database clock (clock_timestamp(), at the write)
-- before expires_at, or the write fails with LE001; and the FOR KEY SHARE
-- lock it takes keeps any other acquisition from committing until this
-- transaction ends. The setting itself proves nothing (anyone can SET it):
-- it only says which token to check, and the check is made on every write.
--
-- The triggers are statement-level BEFORE triggers: one check per write
-- statement, whatever the number of rows (the benchmark reports the cost
-- per row beside a row-level trigger). TRUNCATE only has statement-level
-- triggers anyway. A statement checked before expiry may write its rows
-- after it, as any write checked before expiry may commit after it; no
-- other acquisition can commit meanwhile. INSERT ... ON CONFLICT, MERGE,
-- writable CTEs and foreign-key cascades fire these triggers too.
-- Statement-level triggers are not inherited, so partitioned tables,
-- partitions and inheritance children are refused.

CREATE FUNCTION pglease._guard()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lease    text := TG_ARGV[0];
    declared text;
BEGIN
    declared := nullif(current_setting('pglease.declared', true), '')::jsonb ->> lease;
    IF declared IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'LE002',
            MESSAGE = format('pglease: %s on %s rejected: the table is protected by lease %L '
                             'and this transaction declared no token for it',
                             TG_OP, TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME, lease),
            HINT = format('Call pglease.assert_held(%L, <token>) in the same transaction first.', lease);
    END IF;
    -- Re-check at the moment of this write (LE001 if stale or expired) and
    -- (re)take the lock that holds off other acquisitions until commit.
    PERFORM pglease.assert_held(lease, declared::bigint);
    IF TG_LEVEL = 'ROW' THEN
        RETURN coalesce(NEW, OLD);
    END IF;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION pglease._guard() IS
    'Trigger of protected tables (see pglease.protect): LE002 without a declared '
    'token for the lease, LE001 unless the declared token is still valid.';

CREATE FUNCTION pglease.protect(tbl regclass, name text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked text;
BEGIN
    IF tbl IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'pglease: tbl must not be NULL';
    END IF;
    checked := pglease._check_text('name', protect.name);
    IF (SELECT c.relkind FROM pg_class AS c WHERE c.oid = tbl) IS DISTINCT FROM 'r' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pglease: tbl %s is not an ordinary table', tbl);
    END IF;
    -- Statement-level triggers are not inherited: on a partition or an
    -- inheritance child (or parent), writes through the other member would
    -- not fire them. Refuse rather than protect half a table.
    IF EXISTS (SELECT 1 FROM pg_inherits AS i WHERE i.inhrelid = tbl OR i.inhparent = tbl) THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pglease: tbl %s is part of a partition or inheritance tree, '
                             'which protect does not cover', tbl);
    END IF;
    -- Runs with the caller's rights: only a role allowed to create
    -- triggers on the table (its owner, or one granted TRIGGER) can protect
    -- or unprotect it. Protecting again replaces the lease name.
    EXECUTE format('CREATE OR REPLACE TRIGGER pglease_protect BEFORE INSERT OR UPDATE OR DELETE ON %s '
                   'FOR EACH STATEMENT EXECUTE FUNCTION pglease._guard(%L)', tbl, protect.name);
    EXECUTE format('CREATE OR REPLACE TRIGGER pglease_protect_truncate BEFORE TRUNCATE ON %s '
                   'FOR EACH STATEMENT EXECUTE FUNCTION pglease._guard(%L)', tbl, protect.name);
END
$$;

COMMENT ON FUNCTION pglease.protect(regclass, text) IS
    'Make table TBL reject INSERT, UPDATE, DELETE and TRUNCATE from transactions '
    'that do not hold lease NAME (declared with pglease.assert_held).';

CREATE FUNCTION pglease.unprotect(tbl regclass)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    was boolean;
BEGIN
    IF tbl IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'pglease: tbl must not be NULL';
    END IF;
    was := EXISTS (SELECT 1 FROM pg_trigger AS t
                    WHERE t.tgrelid = tbl AND t.tgname = 'pglease_protect');
    EXECUTE format('DROP TRIGGER IF EXISTS pglease_protect ON %s', tbl);
    EXECUTE format('DROP TRIGGER IF EXISTS pglease_protect_truncate ON %s', tbl);
    RETURN was;
END
$$;

COMMENT ON FUNCTION pglease.unprotect(regclass) IS
    'Remove the protection pglease.protect put on table TBL. Returns whether '
    'it was protected.';

-- Which tables are protected, by which lease.
CREATE VIEW pglease.protected AS
SELECT t.tgrelid::regclass AS tbl,
       -- tgargs holds the one trigger argument followed by a NUL byte.
       convert_from(substring(t.tgargs FROM 1 FOR octet_length(t.tgargs) - 1), 'UTF8') AS name
  FROM pg_trigger AS t
 WHERE t.tgname = 'pglease_protect';

COMMENT ON VIEW pglease.protected IS 'Tables protected by pglease.protect, with their lease.';
