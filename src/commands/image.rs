//! `agentbox image build|list`

use crate::cli::{ImageBuildArgs, ImageCommand};
use crate::config::UsageError;
use crate::image::{KNOWN, KnownImage, build_offline, build_with_docker, image_exists, stderr_progress};
use crate::sandbox::connect_docker;

pub async fn run(cmd: ImageCommand) -> anyhow::Result<u8> {
    match cmd {
        ImageCommand::Build(args) => build(args).await,
        ImageCommand::List => list().await,
    }
}

async fn build(args: ImageBuildArgs) -> anyhow::Result<u8> {
    let known = KnownImage::by_name(&args.name).ok_or_else(|| {
        let names: Vec<&str> = KNOWN.iter().map(|k| k.name).collect();
        UsageError(format!(
            "unknown image {:?}; agentbox builds: {}",
            args.name,
            names.join(", ")
        ))
    })?;
    let docker = connect_docker().await?;
    if !args.force && image_exists(&docker, known.tag).await? {
        outln!("{} already exists (--force rebuilds it)", known.tag);
        return Ok(0);
    }
    let started = std::time::Instant::now();
    if args.offline {
        errln!("building {} offline from Debian packages", known.tag);
        build_offline(&docker, known, args.mirror.as_deref(), &mut stderr_progress).await?;
    } else {
        errln!(
            "building {} through Docker from images/{}/Dockerfile",
            known.tag,
            known.name
        );
        build_with_docker(&docker, known, &mut stderr_progress).await.map_err(|e| {
            anyhow::anyhow!("{e}\nwithout a container registry, build it from Debian packages: agentbox image build --offline")
        })?;
    }
    outln!("built {} in {:.0}s", known.tag, started.elapsed().as_secs_f64());
    Ok(0)
}

async fn list() -> anyhow::Result<u8> {
    let docker = connect_docker().await?;
    for k in KNOWN {
        let state = if image_exists(&docker, k.tag).await? {
            "present"
        } else {
            "missing"
        };
        outln!(
            "{:<10} {:<22} {state}  ({})",
            k.name,
            k.tag,
            k.package_list().join(" ")
        );
    }
    Ok(0)
}
