//! Services for tests: a database (or any server) beside the sandbox, in the sandbox's own network
//! namespace.
//!
//! A service is a container that joins the sandbox container's namespace (`network_mode:
//! container:SANDBOX`): the project reaches it on `127.0.0.1:PORT`, and nothing gains a network
//! (the namespace has only `lo`). It is locked down like the sandbox (see `policy::service_body`)
//! and belongs to one sandbox: started after it, removed before it, never shared, so a verdict
//! never depends on another task's data.

use std::time::Duration;

use crate::image::ServiceDef;

/// The services agentbox knows: its own images (built from Debian packages like the sandbox
/// images; how each starts read-only and non-root, and how readiness is asked, is the image
/// catalogue's [`ServiceDef`]), and what the sandbox's commands are told to connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceKind {
    Postgres,
    Redis,
    Mariadb,
}

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

    /// Its image's name in the catalogue.
    pub fn name(self) -> &'static str {
        match self {
            ServiceKind::Postgres => "postgres",
            ServiceKind::Redis => "redis",
            ServiceKind::Mariadb => "mariadb",
        }
    }

    /// How its image runs it.
    pub fn def(self) -> &'static ServiceDef {
        match self {
            ServiceKind::Postgres => &crate::image::POSTGRES,
            ServiceKind::Redis => &crate::image::REDIS,
            ServiceKind::Mariadb => &crate::image::MARIADB,
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
        self.def().port
    }

    /// A command run inside the service's container that exits 0 once it takes connections.
    pub fn probe(self) -> Vec<String> {
        self.def().probe.iter().map(|a| a.to_string()).collect()
    }

    /// What the sandbox's commands are told, so the usual clients connect with no flags. The
    /// servers let their administrator in without a password, over the namespace's loopback.
    pub(crate) fn connection_env(self) -> Vec<(String, String)> {
        let def = self.def();
        let port = def.port.to_string();
        let mut env = vec![("DATABASE_URL", def.url.to_string())];
        let more: &[(&str, &str)] = match self {
            ServiceKind::Postgres => &[
                ("PGHOST", "127.0.0.1"),
                ("PGUSER", "postgres"),
                ("PGDATABASE", "postgres"),
            ],
            ServiceKind::Redis => &[("REDIS_HOST", "127.0.0.1")],
            ServiceKind::Mariadb => &[("MYSQL_HOST", "127.0.0.1"), ("MYSQL_USER", "root")],
        };
        match self {
            ServiceKind::Postgres => env.push(("PGPORT", port)),
            ServiceKind::Redis => {
                // Redis's own variable; `DATABASE_URL` is for the databases.
                env[0].0 = "REDIS_URL";
                env.push(("REDIS_PORT", port));
            }
            ServiceKind::Mariadb => env.push(("MYSQL_TCP_PORT", port)),
        }
        env.extend(more.iter().map(|(k, v)| (*k, v.to_string())));
        env.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }
}

/// Whether `user` (`NAME`, `UID`, `NAME:GROUP`; empty is the image's default, root) is root.
pub fn is_root(user: &str) -> bool {
    let name = user.split(':').next().unwrap_or("").trim();
    name.is_empty() || name == "root" || name.parse::<u32>().is_ok_and(|uid| uid == 0)
}

/// Why `--service` is refused under gVisor.
pub const NOT_UNDER_GVISOR: &str = "services cannot run beside a gVisor sandbox: gVisor keeps the \
     sandbox's loopback inside its own network stack, where no other container can listen; run \
     without the gVisor runtime, or without --service";

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
            user: Some(kind.def().user.to_string()),
            command: Some(kind.def().start.iter().map(|a| a.to_string()).collect()),
            env: Vec::new(),
            sandbox_env: kind.connection_env(),
            memory_bytes: DEFAULT_SERVICE_MEMORY,
            ready_timeout: DEFAULT_SERVICE_TIMEOUT,
        }
    }

    /// A known server's name on another image, started that image's own way: its port and
    /// connection variables stay.
    pub fn known_on(kind: ServiceKind, name: &str, image: &str) -> ServiceSpec {
        ServiceSpec {
            port: Some(kind.port()),
            sandbox_env: kind.connection_env(),
            ..ServiceSpec::image(name, image)
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
            assert_ne!(kind.def().user, "root");
            // The catalogue's image of that name runs it.
            let image = crate::image::KnownImage::by_tag(kind.image()).unwrap();
            assert_eq!(image.service(), Some(kind.def()));
            let spec = ServiceSpec::known(kind, kind.name());
            assert!(spec.sandbox_env.iter().all(|(_, v)| !v.is_empty()));
            // Every server listens on the namespace's loopback only.
            assert!(spec.command.unwrap_or_default().join(" ").contains("127.0.0.1"));
        }
    }

    #[test]
    fn root_is_root_in_every_spelling() {
        for root in ["", "root", "0", "00", "0:0", "root:staff", " 0 "] {
            assert!(is_root(root), "{root:?}");
        }
        for user in ["postgres", "1000", "1000:0", "65534:65534", "rooted"] {
            assert!(!is_root(user), "{user:?}");
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
