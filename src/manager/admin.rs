//! The administrator's operations, behind [`LeaseManager::admin`]: setting
//! a database up for leases and looking after it, rather than holding
//! leases. What the `pglease` command's administrative commands call; a
//! service that only holds leases does not need them. More of them are
//! defined next to what they read: the diagnosis in `doctor`, the forced
//! release and the timeline in `history`.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgPool;

use super::LeaseManager;
use crate::context::Context;
use crate::db;
use crate::error::{Error, Result};
use crate::limits::check_text;

/// The administrator's operations on a manager's database (see
/// [`LeaseManager::admin`]): protecting tables and fencing DDL, fair
/// lines, the forced release, the diagnosis, and what the `pglease`
/// command reports. Each borrows the manager's pool; none holds a lease.
#[derive(Debug, Clone, Copy)]
pub struct Admin<'a> {
    manager: &'a LeaseManager,
}

impl LeaseManager {
    /// The administrator's operations on this manager's database:
    /// [`Admin::protect`], [`Admin::fence_ddl`], [`Admin::set_fair`],
    /// [`Admin::force_release`], [`Admin::doctor`] and the rest. A service
    /// that only holds leases does not need them.
    pub fn admin(&self) -> Admin<'_> {
        Admin { manager: self }
    }
}

impl Admin<'_> {
    /// The pool of the manager this belongs to.
    pub(crate) fn pool(&self) -> &PgPool {
        self.manager.pool()
    }

    /// The manager this belongs to.
    pub(crate) fn manager(&self) -> &LeaseManager {
        self.manager
    }

    /// What the manager's clones and tasks share.
    pub(crate) fn context(&self) -> &Context {
        self.manager.context()
    }

    /// For a manager connected to a [`Target`](crate::connect::Target)
    /// that is not [plain](crate::connect::Target::is_plain) (several
    /// hosts, or `target_session_attrs` to check): the host it uses now
    /// (`host:port`); `None` otherwise.
    pub fn current_host(&self) -> Option<String> {
        self.context().follow.as_ref().map(|f| f.current())
    }

    /// Whether the role that owns the `pglease` functions may end the
    /// sessions of stale fenced transactions (it is a superuser, or has the
    /// privileges of `pg_signal_backend`), which a takeover from a holder
    /// frozen inside a fenced transaction needs. See docs/design.md,
    /// "Taking over from a frozen holder".
    ///
    /// # Errors
    ///
    /// [`Error::SchemaMissing`] if the schema is missing;
    /// [`Error::Database`] if the database fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn can_end_stale_transactions(&self) -> Result<bool> {
        db::can_end_stale_transactions(self.pool()).await
    }

    /// The role that owns the `pglease` functions: the one
    /// [`can_end_stale_transactions`](Self::can_end_stale_transactions)
    /// is about (`GRANT pg_signal_backend TO` it to allow takeovers from
    /// holders frozen inside fenced transactions).
    ///
    /// # Errors
    ///
    /// [`Error::SchemaMissing`] if the schema is missing;
    /// [`Error::Database`] if the database fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn functions_owner(&self) -> Result<String> {
        db::functions_owner(self.pool()).await
    }

    /// The database server's clock now (`clock_timestamp()`): the clock
    /// every lease decision is made on. Compare a lease's times with it,
    /// never with this machine's clock.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] if the database fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn database_time(&self) -> Result<DateTime<Utc>> {
        db::database_time(self.pool()).await
    }

    /// How many lease names the database knows, held or not (the rows
    /// of the `pglease.status` view).
    ///
    /// # Errors
    ///
    /// [`Error::SchemaMissing`] if the schema is missing;
    /// [`Error::Database`] if the database fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn count_leases(&self) -> Result<u64> {
        db::count_leases(self.pool()).await
    }

    /// Changes lease group `group`'s partition count to `partitions` (1 to
    /// [`MAX_PARTITIONS`](crate::limits::MAX_PARTITIONS)); returns the
    /// count before. The role that created the group, or an
    /// administrator. The members release the partitions beyond the new
    /// count and share out the new ones at their next read (at once: the
    /// change is notified).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad name or count, or a group that
    /// does not exist (nothing sent for a bad count);
    /// [`Error::NotPermitted`] for another role's group;
    /// [`Error::Database`] if the statement failed.
    ///
    /// # Cancel safety
    ///
    /// Dropped before the database answers, the change may or may not
    /// commit.
    pub async fn set_group_partitions(&self, group: &str, partitions: u32) -> Result<u32> {
        check_text("group", group)?;
        if !(1..=crate::limits::MAX_PARTITIONS).contains(&partitions) {
            return Err(Error::invalid(
                "partitions",
                format!(
                    "must be 1 to {}, got {partitions}",
                    crate::limits::MAX_PARTITIONS
                ),
            ));
        }
        db::set_group_partitions(self.pool(), group, partitions).await
    }

    /// Every lease group, by name: its partition count, live members and
    /// partitions with a valid owner now (database clock). Needs SELECT
    /// on `pglease.groups` (administrators, `pglease_admin`).
    ///
    /// # Errors
    ///
    /// [`Error::NotPermitted`] without SELECT on the view;
    /// [`Error::SchemaMissing`] if the schema is missing;
    /// [`Error::Database`] if the database fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn groups(&self) -> Result<Vec<crate::GroupSummary>> {
        db::groups(self.pool()).await
    }

    /// The valid shared holders of lease `name`
    /// ([`AcquireOptions::shared`](crate::AcquireOptions::shared)), the
    /// first acquired first. Needs SELECT on `pglease.shared`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad name (nothing sent);
    /// [`Error::NotPermitted`] without SELECT on the view;
    /// [`Error::Database`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn shared_holders(&self, name: &str) -> Result<Vec<crate::SharedHolder>> {
        check_text("name", name)?;
        db::shared_holders(self.pool(), name).await
    }

    /// Makes every waiter for lease `name` wait in line, first come, first
    /// served, as if each acquisition had
    /// [`AcquireOptions::fair`](crate::AcquireOptions::fair) (`fair`
    /// true), or undoes it: the acquisitions refused while it is held are
    /// told so, and a waiting one joins the line (not an
    /// [`acquire_all`](crate::LeaseManager::acquire_all), which waits in line only
    /// when asked). Administrators only (`pglease.set_fair`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad name (nothing sent);
    /// [`Error::NotPermitted`] for a role that is not an administrator;
    /// [`Error::Database`].
    ///
    /// # Cancel safety
    ///
    /// Dropped in flight, the setting may or may not commit; set it again.
    pub async fn set_fair(&self, name: &str, fair: bool) -> Result<()> {
        check_text("name", name)?;
        db::set_fair(self.pool(), name, fair).await
    }

    /// Makes `table` (a name as SQL would resolve it, e.g. `public.orders`)
    /// reject every INSERT, UPDATE, DELETE and TRUNCATE from a transaction
    /// that has not declared a current token for lease `name`
    /// ([`Error::NotDeclared`], SQLSTATE `LE002`) or whose declared token
    /// is no longer valid at the write ([`Error::NotHeld`], `LE001`).
    /// Fenced transactions declare their token. Needs the right to create
    /// triggers on the table (its owner); protecting again replaces the
    /// lease name.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad name, a table that is not an
    /// ordinary table, or one in a partition or inheritance tree;
    /// [`Error::NotPermitted`] (SQLSTATE `42501`) unless the caller owns the
    /// table.
    ///
    /// # Cancel safety
    ///
    /// Dropped in flight, the protection may or may not be in place (it is
    /// one statement): call it again.
    #[tracing::instrument(name = "pglease.protect", level = "debug", skip(self))]
    pub async fn protect(&self, table: &str, name: &str) -> Result<()> {
        check_text("table", table)?;
        check_text("name", name)?;
        db::protect(self.pool(), table, name).await
    }

    /// Removes the protection [`Admin::protect`] put on `table`;
    /// returns whether it was protected.
    ///
    /// # Errors
    ///
    /// [`Error::NotPermitted`] (SQLSTATE `42501`) unless the caller owns the
    /// table, or if the table does not exist.
    ///
    /// # Cancel safety
    ///
    /// Dropped in flight, the protection may or may not be removed: call it
    /// again.
    #[tracing::instrument(name = "pglease.unprotect", level = "debug", skip(self))]
    pub async fn unprotect(&self, table: &str) -> Result<bool> {
        check_text("table", table)?;
        db::unprotect(self.pool(), table).await
    }

    /// Turns the DDL fence on (`true`) or off for the database: each DDL
    /// command of a session that declares a lease (`pglease run
    /// --declare`, or the settings `pglease.name` and `pglease.token`
    /// given at connection start) is then checked as
    /// [`assert_held`](crate::assert_held) checks, before it runs, so a
    /// stale deployer's `ALTER TABLE` fails and its transaction can be
    /// ended by the next holder's takeover. An undeclared session's DDL is
    /// not checked. Returns whether the fence was on.
    ///
    /// # Errors
    ///
    /// [`Error::NotPermitted`] (SQLSTATE `42501`) unless the role may
    /// create event triggers (a superuser; on a managed service, its
    /// administrator role such as `rds_superuser`).
    ///
    /// # Cancel safety
    ///
    /// Dropped in flight, the fence may or may not have changed: call it
    /// again.
    #[tracing::instrument(name = "pglease.fence_ddl", level = "debug", skip(self))]
    pub async fn fence_ddl(&self, on: bool) -> Result<bool> {
        db::fence_ddl(self.pool(), on).await
    }
}
