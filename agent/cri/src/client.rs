//! A CRI `RuntimeService` client over the runtime's unix socket (IO).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::error::CriError;
use crate::inventory::{ContainerDetails, RuntimeSnapshot};
use crate::runtime::v1::runtime_service_client::RuntimeServiceClient;
use crate::runtime::v1::{
    ContainerEventResponse, ContainerState, ContainerStatusRequest, GetEventsRequest,
    ListContainersRequest, ListPodSandboxRequest, VersionRequest, VersionResponse,
};

/// A connected CRI runtime.
#[derive(Debug, Clone)]
pub struct CriClient {
    socket: PathBuf,
    runtime: RuntimeServiceClient<Channel>,
}

impl CriClient {
    /// Connects to the runtime socket (e.g. `/run/containerd/containerd.sock`).
    /// Fails right away when nothing listens there.
    pub async fn connect(socket: &Path) -> Result<CriClient, CriError> {
        let path = socket.to_owned();
        // The URI is required by tonic but unused: every connection dials the socket.
        let channel = Endpoint::from_static("http://cri.invalid")
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(stream))
                }
            }))
            .await
            .map_err(|source| CriError::Connect {
                socket: socket.display().to_string(),
                source,
            })?;
        Ok(CriClient {
            socket: socket.to_owned(),
            // Responses of nodes with hundreds of pods exceed tonic's 4 MiB default.
            runtime: RuntimeServiceClient::new(channel).max_decoding_message_size(64 * 1024 * 1024),
        })
    }

    /// The socket this client talks to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The raw generated client, for calls this type does not wrap (tests create pods with it).
    pub fn runtime(&mut self) -> &mut RuntimeServiceClient<Channel> {
        &mut self.runtime
    }

    /// The runtime's name and versions.
    pub async fn version(&mut self) -> Result<VersionResponse, CriError> {
        self.runtime
            .version(VersionRequest {
                version: "v1".to_owned(),
            })
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| CriError::call("Version", status))
    }

    /// Lists sandboxes and containers, and fetches the verbose status of each
    /// running container that `known` has no details for yet. Details of
    /// containers that are gone are not carried over, so the cache stays bounded
    /// by the containers that exist. A container that vanishes between the
    /// listing and its status call is simply left without details.
    pub async fn snapshot(
        &mut self,
        known: &HashMap<String, ContainerDetails>,
    ) -> Result<RuntimeSnapshot, CriError> {
        let sandboxes = self
            .runtime
            .list_pod_sandbox(ListPodSandboxRequest { filter: None })
            .await
            .map_err(|status| CriError::call("ListPodSandbox", status))?
            .into_inner()
            .items;
        let containers = self
            .runtime
            .list_containers(ListContainersRequest { filter: None })
            .await
            .map_err(|status| CriError::call("ListContainers", status))?
            .into_inner()
            .containers;
        let mut details = HashMap::new();
        for container in &containers {
            if container.state != ContainerState::ContainerRunning as i32 {
                continue;
            }
            if let Some(cached) = known.get(&container.id) {
                details.insert(container.id.clone(), cached.clone());
                continue;
            }
            let response = self
                .runtime
                .container_status(ContainerStatusRequest {
                    container_id: container.id.clone(),
                    verbose: true,
                })
                .await;
            match response {
                Ok(response) => {
                    let info = ContainerDetails::from_status_info(&response.into_inner().info);
                    details.insert(container.id.clone(), info);
                }
                Err(status) if status.code() == tonic::Code::NotFound => {}
                Err(status) => return Err(CriError::call("ContainerStatus", status)),
            }
        }
        Ok(RuntimeSnapshot {
            sandboxes,
            containers,
            details,
        })
    }

    /// Subscribes to container lifecycle events. Runtimes without the call
    /// (containerd 1.6) answer `Unimplemented`, see [`CriError::is_unimplemented`].
    pub async fn container_events(
        &mut self,
    ) -> Result<tonic::Streaming<ContainerEventResponse>, CriError> {
        self.runtime
            .get_container_events(GetEventsRequest {})
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| CriError::call("GetContainerEvents", status))
    }
}
