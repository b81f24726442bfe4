//! A template's image is checked before it makes a sandbox, at the provider's registration and
//! before each create: it is on the engine, and it has the `user` account, `/workspace`, and,
//! unless the provider mounts its own agent (`agentBinary`), the agent at
//! `/usr/local/bin/computer-agent`. The image's files are read through a container that is
//! created and never started, then removed. A failing image is refused `template_invalid` with
//! the reason, before any sandbox's container exists. A passing verdict is kept per image id
//! (and whether the agent is mounted), so a create checks an image once.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::OnceLock;

use bollard::query_parameters::ContainerArchiveInfoOptionsBuilder;
use bollard::query_parameters::DownloadFromContainerOptionsBuilder;
use futures::StreamExt;

use super::AGENT_PATH;
use super::DockerError;
use super::DockerProvider;
use super::ProviderError;
use super::RemoveContainerOptionsBuilder;
use super::classify;

/// The error kind of an image that cannot be a sandbox.
pub const TEMPLATE_INVALID: &str = "template_invalid";

/// Images that passed, as (image id, agent mounted); at most this many are kept.
const KEPT: usize = 256;

fn passed() -> &'static Mutex<HashSet<(String, bool)>> {
    static PASSED: OnceLock<Mutex<HashSet<(String, bool)>>> = OnceLock::new();
    PASSED.get_or_init(Default::default)
}

fn invalid(image: &str, why: impl std::fmt::Display) -> ProviderError {
    ProviderError::Refused {
        kind: TEMPLATE_INVALID.into(),
        message: format!(
            "the image {image} cannot be a sandbox: {why} (make a template FROM computerd-sandbox:latest, see examples/templates/)"
        ),
    }
}

/// Go's `os.ModeDir`, in the mode the engine's path stat answers.
const MODE_DIR: u32 = 1 << 31;

/// The lines of `/etc/passwd` in the tar archive the engine answers for it (its one member).
fn passwd_of(tar: &[u8]) -> Option<String> {
    let header = tar.get(..512)?;
    let size = std::str::from_utf8(header.get(124..136)?).ok()?.trim_matches(|c: char| c == '\0' || c == ' ');
    let size = usize::from_str_radix(size, 8).ok()?;
    let body = tar.get(512..512 + size)?;
    String::from_utf8(body.to_vec()).ok()
}

impl DockerProvider {
    /// Checks the image of every template this provider may use (the named ones, and the
    /// default and desktop images when no template names those).
    pub async fn check_templates(&self) -> Result<(), ProviderError> {
        let mut images: Vec<String> = self.config.templates.values().map(|t| t.image.clone()).collect();
        if !self.config.templates.contains_key("default") {
            images.push(super::DEFAULT_IMAGE.to_string());
        }
        images.sort();
        images.dedup();
        for image in images {
            self.check_image(&image).await?;
        }
        Ok(())
    }

    /// Checks one image (see the module's comment).
    pub async fn check_image(&self, image: &str) -> Result<(), ProviderError> {
        let docker = self.docker().await?;
        let mounted = self.config.agent_binary.is_some();
        let id = match docker.inspect_image(image).await {
            Ok(i) => i.id.unwrap_or_else(|| image.to_string()),
            Err(DockerError::DockerResponseServerError { status_code: 404, .. }) => {
                return Err(invalid(
                    image,
                    "the Docker engine has no such image (computerd-sandbox:latest and computerd-desktop:latest are built by deploy/build-sandbox-image.sh and deploy/build-desktop-image.sh)",
                ));
            }
            Err(e) => return Err(classify(e)),
        };
        if passed().lock().is_ok_and(|p| p.contains(&(id.clone(), mounted))) {
            return Ok(());
        }
        let name = format!("computerd-check-{}", hex::encode(rand::random::<[u8; 8]>()));
        let opts = super::CreateContainerOptionsBuilder::new().name(&name).build();
        let body = super::ContainerCreateBody {
            image: Some(image.to_string()),
            // Never started: the command is only there because an image may have none.
            cmd: Some(vec!["/computerd-never-runs".into()]),
            network_disabled: Some(true),
            labels: Some([("computerd.check".to_string(), "1".to_string())].into()),
            ..Default::default()
        };
        let created = docker.create_container(Some(opts), body).await.map_err(classify)?;
        let verdict = self.read_layout(docker, &created.id, image, mounted).await;
        let rm = RemoveContainerOptionsBuilder::new().force(true).v(true).build();
        if let Err(e) = docker.remove_container(&created.id, Some(rm)).await {
            tracing::warn!(container = %created.id, error = %e, "a template check's container was not removed");
        }
        verdict?;
        if let Ok(mut p) = passed().lock() {
            if p.len() >= KEPT {
                p.clear();
            }
            p.insert((id, mounted));
        }
        Ok(())
    }

    async fn read_layout(
        &self,
        docker: &bollard::Docker,
        container: &str,
        image: &str,
        mounted: bool,
    ) -> Result<(), ProviderError> {
        let stat = |path: &'static str| {
            let opts = ContainerArchiveInfoOptionsBuilder::new().path(path).build();
            async move {
                match docker.get_container_archive_info(container, Some(opts)).await {
                    Ok(s) => Ok(Some(s)),
                    Err(DockerError::DockerResponseServerError { status_code: 404, .. }) => Ok(None),
                    Err(e) => Err(classify(e)),
                }
            }
        };
        match stat("/workspace").await? {
            Some(s) if s.file_mode & MODE_DIR != 0 => {}
            Some(_) => return Err(invalid(image, "/workspace is not a directory")),
            None => return Err(invalid(image, "it has no /workspace (the sessions' working directory)")),
        }
        if !mounted {
            match stat(AGENT_PATH).await? {
                Some(s) if s.file_mode & MODE_DIR == 0 && s.file_mode & 0o111 != 0 => {}
                _ => {
                    return Err(invalid(
                        image,
                        format!("it has no agent at {AGENT_PATH} (and the provider mounts none: agentBinary)"),
                    ));
                }
            }
        }
        let opts = DownloadFromContainerOptionsBuilder::new().path("/etc/passwd").build();
        let mut tar = Vec::new();
        let mut stream = docker.download_from_container(container, Some(opts));
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(b) if tar.len() + b.len() <= 1 << 20 => tar.extend_from_slice(&b),
                Ok(_) => return Err(invalid(image, "its /etc/passwd is over 1 MiB")),
                Err(DockerError::DockerResponseServerError { status_code: 404, .. }) => {
                    return Err(invalid(image, "it has no /etc/passwd"));
                }
                Err(e) => return Err(classify(e)),
            }
        }
        let passwd = passwd_of(&tar).ok_or_else(|| invalid(image, "its /etc/passwd cannot be read"))?;
        if !passwd.lines().any(|l| l.starts_with("user:")) {
            return Err(invalid(image, "it has no `user` account (sessions run as user)"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_passwd_file_is_read_from_its_archive() {
        let body = b"root:x:0:0::/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n";
        let mut tar = vec![0u8; 512];
        tar[..6].copy_from_slice(b"passwd");
        let size = format!("{:011o}\0", body.len());
        tar[124..136].copy_from_slice(size.as_bytes());
        tar.extend_from_slice(body);
        tar.resize(1024 + 512, 0);
        assert_eq!(passwd_of(&tar).as_deref(), std::str::from_utf8(body).ok());
        assert_eq!(passwd_of(&tar[..100]), None, "a cut archive");
    }
}
