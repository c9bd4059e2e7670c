//! `agentbox image build|list`

use std::time::Instant;

use crate::cli::{ImageBuildArgs, ImageCommand};
use crate::config::UsageError;
use crate::output::stderr_progress;
use crate::sandbox::image::{KNOWN, KnownImage, build_offline, build_with_docker, image_labels};
use crate::sandbox::{Cleanup, connect_docker, human_bytes};
use crate::toolchain::image_toolchains;

pub async fn run(cmd: ImageCommand, cleanup: Cleanup) -> anyhow::Result<u8> {
    match cmd {
        ImageCommand::Build(args) => build(args, cleanup).await,
        ImageCommand::List => list().await,
    }
}

fn chosen(args: &ImageBuildArgs) -> Result<Vec<&'static KnownImage>, UsageError> {
    if args.all {
        return Ok(KNOWN.iter().collect());
    }
    if args.names.is_empty() {
        return Ok(KnownImage::by_name("python").into_iter().collect());
    }
    let mut images: Vec<&'static KnownImage> = Vec::new();
    for name in &args.names {
        let known = KnownImage::by_name(name).ok_or_else(|| {
            let names = |images: &mut dyn Iterator<Item = &'static KnownImage>| {
                images.map(|k| k.name).collect::<Vec<_>>().join(", ")
            };
            UsageError(format!(
                "unknown image {name:?}; agentbox builds the sandboxes {} and the services {} \
                 (or --all)",
                names(&mut KnownImage::sandboxes()),
                names(&mut KnownImage::services())
            ))
        })?;
        if !images.iter().any(|k| k.name == known.name) {
            images.push(known);
        }
    }
    Ok(images)
}

async fn build(args: ImageBuildArgs, cleanup: Cleanup) -> anyhow::Result<u8> {
    let images = chosen(&args)?;
    let docker = connect_docker().await?;
    let mut todo = Vec::new();
    for known in images {
        if !args.force && image_labels(&docker, known.tag).await?.is_some() {
            outln!("{} already exists (--force rebuilds it)", known.tag);
        } else {
            todo.push(known);
        }
    }
    if todo.is_empty() {
        return Ok(0);
    }
    let mut failed = 0;
    if args.offline {
        let started = Instant::now();
        errln!(
            "building {} offline from Debian packages",
            crate::output::escaped(todo.iter().map(|k| k.tag).collect::<Vec<_>>().join(", "))
        );
        for built in build_offline(&docker, &todo, args.mirror.as_deref(), &cleanup, &stderr_progress).await?
        {
            let tag = KnownImage::by_name(built.name).map_or(built.name, |k| k.tag);
            match built.result {
                Ok(took) => outln!(
                    "built {} in {:.0}s{}",
                    crate::output::escaped(tag),
                    took.as_secs_f64(),
                    crate::output::escaped(size_of(&docker, tag).await)
                ),
                Err(e) => {
                    failed += 1;
                    errln!(
                        "agentbox: error: {}: {}",
                        crate::output::escaped(tag),
                        crate::output::escaped(&e)
                    );
                }
            }
        }
        if todo.len() > 1 {
            outln!(
                "{} image(s) in {:.0}s",
                todo.len() - failed,
                started.elapsed().as_secs_f64()
            );
        }
    } else {
        for known in todo {
            errln!(
                "building {} through Docker from images/Dockerfile and images/{}/packages",
                known.tag,
                known.name
            );
            let started = Instant::now();
            // Without a registry the first build fails on its base image, and so would the
            // others: stop at the first failure.
            build_with_docker(&docker, known, &cleanup, &stderr_progress)
                .await
                .map_err(|e| {
                    anyhow::anyhow!(
                        "{e}\nwithout a container registry, build it from Debian packages: \
                         agentbox image build {} --offline",
                        known.name
                    )
                })?;
            outln!(
                "built {} in {:.0}s{}",
                known.tag,
                started.elapsed().as_secs_f64(),
                crate::output::escaped(size_of(&docker, known.tag).await)
            );
        }
    }
    Ok(if failed > 0 { 1 } else { 0 })
}

async fn size_of(docker: &bollard::Docker, tag: &str) -> String {
    match docker.inspect_image(tag).await.ok().and_then(|i| i.size) {
        Some(bytes) => format!(", {}", human_bytes(bytes.max(0) as u64)),
        None => String::new(),
    }
}

async fn list() -> anyhow::Result<u8> {
    let docker = connect_docker().await?;
    for k in KNOWN {
        let labels = image_labels(&docker, k.tag).await?;
        let state = match &labels {
            Some(_) => format!("present{}", size_of(&docker, k.tag).await),
            None => "missing".to_string(),
        };
        // A sandbox is told by its toolchains (its labels), a service by where it listens.
        let what = match k.service() {
            Some(s) => format!("service on 127.0.0.1:{} as {}", s.port, s.user),
            None => labels
                .map(|l| {
                    image_toolchains(&l)
                        .into_iter()
                        .map(|(t, v)| format!("{} {v}", t.display()))
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default(),
        };
        let state = format!("{state}  {what}").trim_end().to_string();
        outln!("{:<9} {:<20} {}", k.name, k.tag, crate::output::escaped(&state));
        outln!(
            "          packages: {}",
            crate::output::escaped(k.package_list().join(" "))
        );
    }
    Ok(0)
}
