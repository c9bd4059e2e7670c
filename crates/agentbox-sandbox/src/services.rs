//! Services for tests: a database (or any server) beside the sandbox, in the sandbox's own network
//! namespace.
//!
//! A service is a container that joins the sandbox container's namespace (`network_mode:
//! container:SANDBOX`): the project reaches it on `127.0.0.1:PORT`, and nothing gains a network
//! (the namespace has only `lo`). It is locked down like the sandbox (see `policy::service_body`)
//! and belongs to one sandbox: started after it, removed before it, never shared, so a verdict
//! never depends on another task's data.

use std::time::Duration;

/// The services agentbox knows: its own images (built from Debian packages like the sandbox
/// images), how they start read-only and non-root, how readiness is asked, and what the
/// sandbox's commands are told to connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceKind {
    Postgres,
    Redis,
    Mariadb,
}

/// Where a known service keeps its data: a tmpfs of its own (never the project).
pub const SERVICE_DATA: &str = "/var/lib/agentbox-service";

impl ServiceKind {
    pub const ALL: [ServiceKind; 3] = [ServiceKind::Postgres, ServiceKind::Redis, ServiceKind::Mariadb];

    /// By the name a user gives (`--service postgres`); `mysql` is MariaDB's image.
    pub fn by_name(name: &str) -> Option<ServiceKind> {
        match name.to_ascii_lowercase().as_str() {
            "postgres" | "postgresql" => Some(ServiceKind::Postgres),
            "redis" => Some(ServiceKind::Redis),
            "mariadb" | "mysql" => Some(ServiceKind::Mariadb),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ServiceKind::Postgres => "postgres",
            ServiceKind::Redis => "redis",
            ServiceKind::Mariadb => "mariadb",
        }
    }

    /// agentbox's image of it (`agentbox image build NAME`).
    pub fn image(self) -> &'static str {
        match self {
            ServiceKind::Postgres => "agentbox/postgres:1",
            ServiceKind::Redis => "agentbox/redis:1",
            ServiceKind::Mariadb => "agentbox/mariadb:1",
        }
    }

    pub fn port(self) -> u16 {
        match self {
            ServiceKind::Postgres => 5432,
            ServiceKind::Redis => 6379,
            ServiceKind::Mariadb => 3306,
        }
    }

    /// The image's own unprivileged user, made by its Debian package (the server refuses root,
    /// or should never be it).
    pub fn user(self) -> &'static str {
        match self {
            ServiceKind::Postgres => "postgres",
            ServiceKind::Redis => "redis",
            ServiceKind::Mariadb => "mysql",
        }
    }

    /// The server's command in agentbox's image: data in [`SERVICE_DATA`] (a tmpfs), sockets
    /// in `/tmp`, listening on 127.0.0.1 only. Durability is off where the server allows it: the
    /// data dies with the session anyway, and a test suite waits less.
    pub fn command(self) -> Vec<String> {
        let script = match self {
            // Debian keeps the server's programs under a versioned directory, off PATH.
            ServiceKind::Postgres => format!(
                "set -e; PATH=$(echo /usr/lib/postgresql/*/bin):$PATH; \
                 initdb -D {SERVICE_DATA}/pg -U postgres --auth=trust -E UTF8 --no-sync >/dev/null; \
                 exec postgres -D {SERVICE_DATA}/pg -k /tmp -c listen_addresses=127.0.0.1 \
                 -c port=5432 -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            ),
            ServiceKind::Redis => "exec redis-server --bind 127.0.0.1 --port 6379 --save '' \
                 --appendonly no --dir /tmp --protected-mode no"
                .to_string(),
            ServiceKind::Mariadb => format!(
                "set -e; mariadb-install-db --datadir={SERVICE_DATA}/db --user=mysql \
                 --auth-root-authentication-method=normal --skip-test-db >/dev/null; \
                 exec mariadbd --datadir={SERVICE_DATA}/db --socket=/tmp/mysqld.sock \
                 --pid-file=/tmp/mysqld.pid --bind-address=127.0.0.1 --port=3306 \
                 --skip-name-resolve --innodb-flush-log-at-trx-commit=0"
            ),
        };
        vec!["sh".into(), "-c".into(), script]
    }

    /// A command run inside the service's container that exits 0 once it takes connections.
    pub fn probe(self) -> Vec<String> {
        let script = match self {
            ServiceKind::Postgres => {
                "PATH=$(echo /usr/lib/postgresql/*/bin):$PATH; pg_isready -q -h 127.0.0.1 -p 5432 -U postgres"
            }
            ServiceKind::Redis => "test \"$(redis-cli -h 127.0.0.1 -p 6379 ping)\" = PONG",
            ServiceKind::Mariadb => "mariadb-admin --protocol=tcp -h 127.0.0.1 -P 3306 -u root ping",
        };
        vec!["sh".into(), "-c".into(), script.into()]
    }

    /// What the sandbox's commands are told, so the usual clients connect with no flags.
    pub fn connection_env(self) -> Vec<(String, String)> {
        let pairs: &[(&str, &str)] = match self {
            ServiceKind::Postgres => &[
                (
                    "DATABASE_URL",
                    "postgresql://postgres:postgres@127.0.0.1:5432/postgres",
                ),
                ("PGHOST", "127.0.0.1"),
                ("PGPORT", "5432"),
                ("PGUSER", "postgres"),
                ("PGPASSWORD", "postgres"),
                ("PGDATABASE", "postgres"),
            ],
            ServiceKind::Redis => &[
                ("REDIS_URL", "redis://127.0.0.1:6379/0"),
                ("REDIS_HOST", "127.0.0.1"),
                ("REDIS_PORT", "6379"),
            ],
            ServiceKind::Mariadb => &[
                ("DATABASE_URL", "mysql://root@127.0.0.1:3306/mysql"),
                ("MYSQL_HOST", "127.0.0.1"),
                ("MYSQL_TCP_PORT", "3306"),
                ("MYSQL_USER", "root"),
                ("MYSQL_DATABASE", "mysql"),
            ],
        };
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}

/// One service of a sandbox.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceSpec {
    /// As the user named it (`--service NAME`, `[services.NAME]`): in messages and labels.
    pub name: String,
    pub image: String,
    /// A known server (agentbox's start command and probe), or `None`: the image's own
    /// entrypoint and command, and readiness by a TCP connect to `port`.
    pub kind: Option<ServiceKind>,
    /// The port it listens on inside the namespace; `None`: ready once it runs.
    pub port: Option<u16>,
    /// Its user; `None`: the known server's, else the image's own unless that is root, then
    /// nobody (65534): a service never runs as root.
    pub user: Option<String>,
    /// Its command, replacing the known one or the image's.
    pub command: Option<Vec<String>>,
    /// Its environment (not the sandbox's).
    pub env: Vec<(String, String)>,
    /// Variables set in the sandbox for its commands (connection settings).
    pub sandbox_env: Vec<(String, String)>,
    /// Memory limit, its tmpfs data included.
    pub memory_bytes: i64,
    /// How long it may take to take connections.
    pub ready_timeout: Duration,
}

/// A service's memory when none is given: a test database's working set, with its data on a
/// tmpfs counted against it.
pub const DEFAULT_SERVICE_MEMORY: i64 = 512 << 20;

/// How long a service may take to start when `--service-timeout` is not given. MariaDB's first
/// start initialises its system tables.
pub const DEFAULT_SERVICE_TIMEOUT: Duration = Duration::from_secs(60);

impl ServiceSpec {
    /// A known server in agentbox's image (or in `image`, which must start the same way).
    pub fn known(kind: ServiceKind, name: &str) -> ServiceSpec {
        ServiceSpec {
            name: name.to_string(),
            image: kind.image().to_string(),
            kind: Some(kind),
            port: Some(kind.port()),
            user: Some(kind.user().to_string()),
            command: Some(kind.command()),
            env: Vec::new(),
            sandbox_env: kind.connection_env(),
            memory_bytes: DEFAULT_SERVICE_MEMORY,
            ready_timeout: DEFAULT_SERVICE_TIMEOUT,
        }
    }

    /// Any other image, started by its own entrypoint.
    pub fn image(name: &str, image: &str) -> ServiceSpec {
        ServiceSpec {
            name: name.to_string(),
            image: image.to_string(),
            kind: None,
            port: None,
            user: None,
            command: None,
            env: Vec::new(),
            sandbox_env: Vec::new(),
            memory_bytes: DEFAULT_SERVICE_MEMORY,
            ready_timeout: DEFAULT_SERVICE_TIMEOUT,
        }
    }
}

/// Services that cannot run side by side in one namespace.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BadServices {
    #[error("the service {0} is named twice")]
    NamedTwice(String),
    #[error(
        "the services {first} and {second} both listen on port {port}: they share one network \
         namespace, so one of them could not start (give one of them another port)"
    )]
    SamePort {
        first: String,
        second: String,
        port: u16,
    },
    #[error("service name {0:?}: letters, digits, '-' and '_' only")]
    BadName(String),
}

/// Check that `services` can start together.
pub fn check_services(services: &[ServiceSpec]) -> Result<(), BadServices> {
    for (i, a) in services.iter().enumerate() {
        if a.name.is_empty()
            || !a
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(BadServices::BadName(a.name.clone()));
        }
        for b in &services[..i] {
            if a.name == b.name {
                return Err(BadServices::NamedTwice(a.name.clone()));
            }
            if let (Some(port), true) = (a.port, a.port == b.port) {
                return Err(BadServices::SamePort {
                    first: b.name.clone(),
                    second: a.name.clone(),
                    port,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_services_are_found_by_their_usual_names() {
        assert_eq!(ServiceKind::by_name("PostgreSQL"), Some(ServiceKind::Postgres));
        assert_eq!(ServiceKind::by_name("mysql"), Some(ServiceKind::Mariadb));
        assert_eq!(ServiceKind::by_name("mongo"), None);
        for kind in ServiceKind::ALL {
            assert_eq!(ServiceKind::by_name(kind.name()), Some(kind));
            assert_ne!(kind.user(), "root");
            let spec = ServiceSpec::known(kind, kind.name());
            assert!(spec.sandbox_env.iter().all(|(_, v)| !v.is_empty()));
            // Every server listens on the namespace's loopback only.
            assert!(spec.command.unwrap_or_default().join(" ").contains("127.0.0.1"));
        }
    }

    #[test]
    fn two_services_on_one_port_or_one_name_are_refused() {
        let pg = ServiceSpec::known(ServiceKind::Postgres, "postgres");
        let mut other = ServiceSpec::image("pg2", "example/pg");
        other.port = Some(5432);
        let err = check_services(&[pg.clone(), other.clone()]).unwrap_err();
        assert!(err.to_string().contains("port 5432"), "{err}");
        other.port = Some(5433);
        assert!(check_services(&[pg.clone(), other]).is_ok());
        assert_eq!(
            check_services(&[pg.clone(), pg.clone()]),
            Err(BadServices::NamedTwice("postgres".into()))
        );
        let bad = ServiceSpec::image("a b", "x");
        assert!(check_services(&[bad]).is_err());
    }
}
