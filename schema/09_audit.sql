-- =====================================================================
-- 9. THE SECURITY POSTURE, FOR `pglease doctor`
-- =====================================================================

-- One row per finding: level ('ok', 'warn' or 'info'), topic, and a
-- sentence. SECURITY DEFINER, to read the bindings and grants; it shows
-- nothing a role with USAGE on the schema could not learn from the
-- catalogs, but the names of protected tables' leases and name grants.
CREATE FUNCTION pglease.audit()
RETURNS TABLE (level text, topic text, message text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r record;
    n bigint;
BEGIN
    -- Who may call the functions at all: USAGE on the schema.
    IF has_schema_privilege('public', 'pglease', 'USAGE') THEN
        RETURN QUERY SELECT 'warn', 'schema',
            'PUBLIC has USAGE on schema pglease: every role that can connect may take leases; '
            'REVOKE USAGE ON SCHEMA pglease FROM PUBLIC and grant it to the application roles';
    END IF;
    SELECT string_agg(quote_ident(a.rolname), ', ' ORDER BY a.rolname), count(*) INTO r
      FROM pg_roles AS a
     WHERE NOT a.rolsuper AND a.rolname !~ '^pg_'
       AND has_schema_privilege(a.oid, 'pglease', 'USAGE')
       AND NOT pg_has_role(a.oid, current_user, 'MEMBER');
    RETURN QUERY SELECT 'info', 'schema',
        format('roles that may use pglease (USAGE on the schema): %s', coalesce(r.string_agg, 'none but its owner'));
    -- The administrators' functions check is_admin() themselves; EXECUTE
    -- on force_release is granted to pglease_admin only.
    IF has_function_privilege('public', 'pglease.force_release(text, text)', 'EXECUTE') THEN
        RETURN QUERY SELECT 'warn', 'functions',
            'PUBLIC has EXECUTE on pglease.force_release (it still checks that the caller is '
            'an administrator): REVOKE EXECUTE ON FUNCTION pglease.force_release(text, text) '
            'FROM PUBLIC';
    END IF;
    -- Administrators.
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pglease_admin') THEN
        SELECT string_agg(quote_ident(m.rolname), ', ' ORDER BY m.rolname) INTO r
          FROM pg_auth_members AS am
          JOIN pg_roles AS g ON g.oid = am.roleid AND g.rolname = 'pglease_admin'
          JOIN pg_roles AS m ON m.oid = am.member;
        RETURN QUERY SELECT 'info', 'administrators',
            format('superusers, members of %I (the owner), and members of pglease_admin: %s',
                   current_user, coalesce(r.string_agg, 'none'));
    ELSE
        RETURN QUERY SELECT 'warn', 'administrators',
            format('role pglease_admin does not exist: only superusers and members of %I are '
                   'pglease administrators (CREATE ROLE pglease_admin NOLOGIN, then migrate again)',
                   current_user);
    END IF;
    -- Ending stale fenced sessions.
    IF pglease.can_end_stale_transactions() THEN
        RETURN QUERY SELECT 'ok', 'takeover',
            format('role %I, which owns the functions, may end stale fenced sessions', current_user);
    ELSE
        RETURN QUERY SELECT 'warn', 'takeover',
            format('role %I, which owns the functions, may not end stale fenced sessions: '
                   'GRANT pg_signal_backend TO %I', current_user, current_user);
    END IF;
    -- Name grants.
    SELECT count(*) INTO n FROM pglease.name_grants;
    IF n = 0 THEN
        RETURN QUERY SELECT 'info', 'names',
            'no names are granted by prefix: every role that may use pglease may acquire any name';
    ELSE
        FOR r IN SELECT g.prefix, string_agg(quote_ident(g.role), ', ' ORDER BY g.role) AS roles,
                        bool_and(EXISTS (SELECT 1 FROM pg_roles AS x WHERE x.rolname = g.role)) AS exist
                   FROM pglease.name_grants AS g GROUP BY g.prefix ORDER BY g.prefix LOOP
            RETURN QUERY SELECT CASE WHEN r.exist THEN 'info' ELSE 'warn' END, 'names',
                format('names under %L: %s%s', r.prefix, r.roles,
                       CASE WHEN r.exist THEN '' ELSE ' (a granted role no longer exists)' END);
        END LOOP;
    END IF;
    -- Protected tables.
    FOR r IN SELECT p.tbl, p.name, p.intact FROM pglease.protected AS p ORDER BY p.tbl::text LOOP
        IF NOT r.intact THEN
            RETURN QUERY SELECT 'warn', 'protected',
                format('table %s is NOT protected any more: a guard trigger was dropped, disabled '
                       'or replaced; its owner should run pglease.protect(%L, %L) again',
                       r.tbl, r.tbl::text, r.name);
        END IF;
        RETURN QUERY
        SELECT 'warn', 'protected',
               format('role %I holds TRIGGER on protected table %s and may replace its guard '
                      'triggers: REVOKE TRIGGER ON %s FROM %I (grant SELECT, INSERT, UPDATE, '
                      'DELETE only)', g.rolname, r.tbl, r.tbl, g.rolname)
          FROM pg_class AS c
         CROSS JOIN LATERAL aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) AS x
          JOIN pg_roles AS g ON g.oid = x.grantee
         WHERE c.oid = r.tbl AND x.privilege_type = 'TRIGGER' AND x.grantee <> c.relowner;
        IF has_table_privilege('public', r.tbl, 'TRIGGER') THEN
            RETURN QUERY SELECT 'warn', 'protected',
                format('PUBLIC holds TRIGGER on protected table %s: REVOKE TRIGGER ON %s FROM PUBLIC',
                       r.tbl, r.tbl);
        END IF;
    END LOOP;
    -- What fences declared sessions (see DECLARED SESSIONS): per lease,
    -- its protected tables and the DDL fence; a migration tool's version
    -- table left unprotected.
    FOR r IN SELECT p.name, string_agg(p.tbl::text, ', ' ORDER BY p.tbl::text) AS tables
               FROM pglease.protected AS p GROUP BY p.name ORDER BY p.name LOOP
        RETURN QUERY SELECT 'info', 'fences',
            format('lease %L fences tables %s; its declared sessions'' DDL %s', r.name, r.tables,
                   CASE WHEN pglease.ddl_fenced() THEN 'is fenced (the database''s DDL fence)'
                        ELSE 'is not fenced' END);
    END LOOP;
    RETURN QUERY SELECT 'info', 'fences',
        CASE WHEN pglease.ddl_fenced()
             THEN 'the DDL fence is on: each DDL command of a session that declares a lease '
                  'is checked under its token'
             ELSE 'the DDL fence is off: a session that declares a lease is checked only as '
                  'it writes a protected table, not at its DDL (a superuser turns the fence on: '
                  'pglease.fence_ddl(true))'
        END;
    RETURN QUERY
    SELECT 'warn', 'fences',
           format('table %s, by its name %s''s version table, is not protected: a deployer '
                  'frozen past its lease''s TTL can still commit its migration; its owner runs '
                  'pglease protect --tool %s --lease NAME (or pglease.protect(%L, NAME))',
                  c.oid::regclass, t.tool, t.tool, c.oid::regclass::text)
      FROM pglease.migration_tools() AS t
      JOIN pg_class AS c ON c.relname = t.version_table AND c.relkind = 'r'
      JOIN pg_namespace AS n ON n.oid = c.relnamespace AND n.nspname <> 'pglease'
     WHERE NOT EXISTS (SELECT 1 FROM pglease._protected AS p WHERE p.tbl = c.oid)
     ORDER BY c.oid::regclass::text;
    -- The time a frozen transaction that no fence sees keeps its locks.
    IF EXISTS (SELECT 1 FROM pglease._protected)
       AND current_setting('idle_in_transaction_session_timeout') IN ('0', '0ms') THEN
        RETURN QUERY SELECT 'info', 'fences',
            'idle_in_transaction_session_timeout is off: a frozen transaction that wrote only '
            'unprotected tables is ended by the next holder''s takeover only when its session '
            'declared the lease; otherwise it keeps its locks until it resumes. Bound it for '
            'the roles that run migrations and jobs (ALTER ROLE ... SET '
            'idle_in_transaction_session_timeout = ''5min'')';
    END IF;
    -- The history.
    RETURN QUERY SELECT 'info', 'history',
        format('history kept for %s, at most about %s rows (pglease.set_history)',
               c.retention, c.max_rows)
      FROM pglease._history_config AS c;
END
$$;

COMMENT ON FUNCTION pglease.audit() IS
    'The security posture, one finding per row (level ok/warn/info, topic, message): who '
    'may use the schema, who administers, whether stale fenced sessions can be ended, '
    'name grants, protected tables (intact, roles holding TRIGGER), the history''s bounds.';
