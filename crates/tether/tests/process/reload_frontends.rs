//! A tenant's own frontend that cannot be bound when a reload adds it (issue 27): the reload
//! applies all the same, with the tenant's other settings; the error is logged with the
//! tenant and the reason; tenant A is served throughout; and the next changed routing file
//! that still declares the frontend binds it, once it can be.

use tether_testkit::targets::EchoServer;

use crate::reload::{
    ConfigMap, LIMIT, Mode, ReloadingServer, dialed, echo_once, own_uid, pki_with_agent_b, routing,
    spawn_agent_b,
};
use crate::until;

#[tokio::test]
async fn a_tenant_frontend_that_cannot_be_bound_is_logged_and_bound_by_a_later_reload() {
    let mode = Mode::Grpc;
    let pki = pki_with_agent_b();
    let uid = own_uid(&pki);
    // Its directory does not exist yet: binding the socket fails.
    let late = pki.dir().join("late");
    let b_socket = late.join("b.sock");
    let mut map = ConfigMap::new(pki.dir().join("config"), &routing(uid, None, None));
    let reloading = ReloadingServer::spawn(&pki, mode, &map).await;
    let _agent_a = reloading.spawn_agent_a(&pki).await;
    let _agent_b = spawn_agent_b(&pki, &reloading.server).await;
    let echo = EchoServer::start().await.unwrap();
    let echo_addr = echo.addr.to_string();

    // Tenant B added with a socket that cannot be bound: generation 2 applies without it.
    map.update(&routing(uid, None, Some(&b_socket)));
    reloading.until_generation(2).await;
    let line = reloading
        .logged("the failed bind is logged", |l| {
            l.contains("cannot serve the tenant's own frontend")
        })
        .await;
    assert!(
        line.contains("tenant=\"b\"")
            && line.contains("generation=2")
            && line.contains(&b_socket.display().to_string())
            && line.contains("No such file or directory"),
        "{line}"
    );
    assert!(!b_socket.exists());
    // B's other settings apply: its agent is admitted under it.
    reloading
        .logged("agent B admitted under tenant B", |l| {
            l.contains("agent connected") && l.contains("agent-b") && l.contains("tenant=\"b\"")
        })
        .await;
    // Tenant A is served.
    echo_once(mode, &reloading.main, &echo_addr).await.unwrap();

    // The directory made, a changed file that still declares B's socket binds it.
    std::fs::create_dir(&late).unwrap();
    map.update(&routing(uid, Some(LIMIT), Some(&b_socket)));
    let bound = until("tenant B's socket", || async { b_socket.exists() }).await;
    reloading.until_generation(3).await;
    echo_once(mode, &b_socket, &echo_addr).await.unwrap();
    eprintln!("tenant B's socket was bound {bound:?} after generation 3 was written");

    reloading.audited(&[dialed("a", 2), dialed("b", 3)]).await;
}
