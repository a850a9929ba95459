//! `--server-discovery=dns` with the system's resolver: a `tether agent` process holds one
//! stream to each address its server name resolves to, follows the name as its addresses
//! change, and lets go of a server whose address left. The name is `localhost`, which the
//! test PKI's server certificate holds; the agent runs in a mount namespace of its own
//! where `/etc/hosts` maps it to the fleet's addresses, so the lookup is the real one
//! (getaddrinfo) and no query leaves the machine.

use std::net::SocketAddr;
use std::path::Path;

use tether_testkit::fleet::Fleet;
use tether_testkit::http::metric_value;
use tether_testkit::process::{Process, agent_args, free_port};

use crate::{bin, until};

const READY_AGENTS: &str = "konnectivity_network_proxy_server_ready_backend_connections";

/// `addresses` as `/etc/hosts` lines naming `localhost`.
fn hosts(addresses: &[SocketAddr]) -> String {
    addresses
        .iter()
        .map(|a| format!("{} localhost\n", a.ip()))
        .collect()
}

/// `tether agent` in a mount namespace where `/etc/hosts` is `hosts_file`, bind-mounted:
/// a write to the file in place is what the agent's next lookup sees.
async fn spawn_agent_with_hosts(fleet: &Fleet, hosts_file: &Path) -> Process {
    let health = free_port();
    let mut args = vec![
        "-m".to_owned(),
        "sh".into(),
        "-c".into(),
        format!(
            "mount --bind '{}' /etc/hosts && exec \"$0\" \"$@\"",
            hosts_file.display()
        ),
        bin().display().to_string(),
    ];
    args.extend(agent_args(
        &fleet.pki,
        fleet.address(2),
        health,
        free_port(),
    ));
    args.extend([
        "--proxy-server-host=localhost".to_owned(),
        "--server-discovery=dns".into(),
        "--server-discovery-interval=200ms".into(),
    ]);
    Process::spawn(Path::new("unshare"), args, ([127, 0, 0, 1], health).into())
        .await
        .expect("unshare -m needs root (CAP_SYS_ADMIN), as CI has")
}

/// The agent's open server streams are `n`.
async fn assert_streams(agent: &Process, n: usize) {
    let text = agent.metrics().await.unwrap();
    assert_eq!(
        metric_value(
            &text,
            "konnectivity_network_proxy_agent_open_server_connections"
        ),
        Some(n as f64),
        "{text}"
    );
}

async fn ready_agents(fleet: &Fleet, member: usize) -> f64 {
    let text = fleet.servers[member].metrics().await.unwrap();
    metric_value(&text, READY_AGENTS).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_holds_one_stream_per_address_of_its_servers_name_and_follows_it() {
    tether_testkit::init_logging();
    let fleet = Fleet::start(3).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let hosts_file = dir.path().join("hosts");
    std::fs::write(&hosts_file, hosts(&[fleet.address(2), fleet.address(3)])).unwrap();
    let agent = spawn_agent_with_hosts(&fleet, &hosts_file).await;
    let took = until(
        "the agent holds both servers its name resolves to",
        || async { ready_agents(&fleet, 0).await == 1.0 && ready_agents(&fleet, 1).await == 1.0 },
    )
    .await;
    eprintln!("two servers held {took:?} after the agent answered /healthz");
    tether_testkit::http::wait_for_200(agent.health, "/readyz", crate::STEP)
        .await
        .unwrap();
    assert_eq!(
        ready_agents(&fleet, 2).await,
        0.0,
        "an address the name lacks"
    );

    // The name moves: .4 joins, .3 leaves (a pod replaced). Written in place, as the bind
    // mount shows the file's own contents.
    std::fs::write(&hosts_file, hosts(&[fleet.address(2), fleet.address(4)])).unwrap();
    let took = until("the agent holds the server that joined", || async {
        ready_agents(&fleet, 2).await == 1.0
    })
    .await;
    eprintln!("the joining server held {took:?} after the name changed");
    until("the agent lets go of the server that left", || async {
        ready_agents(&fleet, 1).await == 0.0
    })
    .await;
    assert_eq!(
        ready_agents(&fleet, 0).await,
        1.0,
        "the server that stayed keeps its stream"
    );
    assert_streams(&agent, 2).await;
}

/// Dials through the servers in `members` (indexes into the fleet) in turn, each carrying
/// one echo, until `stop`; counts the dials that failed and those that worked.
async fn steady_dials(
    fleet: &Fleet,
    members: &std::sync::Mutex<Vec<usize>>,
    echo: &tether_testkit::targets::EchoServer,
    stop: &tokio_util::sync::CancellationToken,
) -> (u64, u64) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut worked, mut failed) = (0u64, 0u64);
    for round in 0..50_000usize {
        if stop.is_cancelled() {
            break;
        }
        let member = {
            let members = members.lock().unwrap();
            members[round % members.len()]
        };
        let uds = fleet.servers[member].uds.clone().unwrap();
        let attempt = async {
            let client =
                tether_client::GrpcClient::connect(&tether_client::Transport::Unix(uds)).await?;
            let mut tunnel = client.dial(&echo.addr.to_string()).await?;
            tunnel.write_all(b"ping").await?;
            let mut back = [0u8; 4];
            tunnel.read_exact(&mut back).await?;
            anyhow::Ok(())
        };
        match tokio::time::timeout(crate::STEP, attempt).await {
            Ok(Ok(())) => worked += 1,
            Ok(Err(e)) => {
                eprintln!("dial {round} through server {member} failed: {e}");
                failed += 1;
            }
            Err(_) => {
                eprintln!("dial {round} through server {member} hung");
                failed += 1;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    (worked, failed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_three_to_four_to_two_servers_under_steady_dials_fails_none() {
    tether_testkit::init_logging();
    let mut fleet = Fleet::start(4).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let hosts_file = dir.path().join("hosts");
    let named = |members: &[u8]| {
        hosts(
            &members
                .iter()
                .map(|&m| fleet.address(m))
                .collect::<Vec<_>>(),
        )
    };
    std::fs::write(&hosts_file, named(&[2, 3, 4])).unwrap();
    let agent = spawn_agent_with_hosts(&fleet, &hosts_file).await;
    until("the agent holds the three named servers", || async {
        ready_agents(&fleet, 0).await == 1.0
            && ready_agents(&fleet, 1).await == 1.0
            && ready_agents(&fleet, 2).await == 1.0
    })
    .await;
    let echo = tether_testkit::targets::EchoServer::start().await.unwrap();
    let members = std::sync::Mutex::new(vec![0, 1, 2]);
    let stop = tokio_util::sync::CancellationToken::new();
    let load = steady_dials(&fleet, &members, &echo, &stop);
    let scale = async {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        // 3 → 4: the name gains .5.
        std::fs::write(&hosts_file, named(&[2, 3, 4, 5])).unwrap();
        let up = until("the agent holds the fourth server", || async {
            ready_agents(&fleet, 3).await == 1.0
        })
        .await;
        members.lock().unwrap().push(3);
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        // 4 → 2: .4 and .5 leave the name, and clients stop using them, as when their pods
        // terminate.
        members.lock().unwrap().retain(|&m| m < 2);
        std::fs::write(&hosts_file, named(&[2, 3])).unwrap();
        let down = until("the agent lets go of the two that left", || async {
            ready_agents(&fleet, 2).await == 0.0 && ready_agents(&fleet, 3).await == 0.0
        })
        .await;
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        stop.cancel();
        (up, down)
    };
    let ((worked, failed), (up, down)) = tokio::join!(load, scale);
    eprintln!(
        "3 → 4 held in {up:?}, 4 → 2 let go in {down:?}; {worked} dials worked, {failed} failed"
    );
    assert_eq!(failed, 0, "no dial fails while the fleet scales");
    assert!(worked >= 20, "the load ran: {worked} dials");
    assert_streams(&agent, 2).await;
    for server in fleet.servers.drain(2..) {
        server.stop().await;
    }
}
