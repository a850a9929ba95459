//! Two connections spliced end to end, as a server that holds an agent carries a connection
//! a peer server dialed through it: the "client" link (its server end dials, the middle
//! answers) and the "agent" link (the middle dials, its agent end answers), both in memory.
//! Bytes arrive exactly both ways, either end's close reaches the other with its error, and
//! a reader that stalls one spliced connection holds no other back.

mod common;

use common::{Kind, Pair, assert_same, payload, recv_closed, recv_exact, send, within};
use tether_tunnel::{CloseError, Spliced, Tunnel, splice};
use tokio::task::JoinHandle;

/// One spliced connection: the client's end, the far answerer's end, and the middle's task.
struct Chain {
    client: Tunnel,
    far: Tunnel,
    middle: JoinHandle<Spliced>,
}

/// The client link's server dials; the middle answers and dials the agent link for it; the
/// agent link's agent answers; the middle splices the two.
async fn chain(client_link: &mut Pair, agent_link: &mut Pair) -> Chain {
    let mut pending = client_link.dial("far:1");
    let requested = client_link.agent.next_dial().await;
    let mut onward = agent_link.dial(&requested.address);
    let far_requested = agent_link.agent.next_dial().await;
    let far = far_requested.dial.accept().expect("still wanted");
    let dialed = within("the onward dial's answer", onward.answer())
        .await
        .expect("the far end accepted");
    let answered = requested.dial.accept().expect("still wanted");
    let middle = tokio::spawn(splice(answered, dialed));
    let client = within("the dial's answer", pending.answer())
        .await
        .expect("the middle accepted");
    Chain {
        client,
        far,
        middle,
    }
}

async fn links() -> (Pair, Pair) {
    (Pair::new(Kind::Native).await, Pair::new(Kind::Native).await)
}

async fn idle_and_shut((client_link, agent_link): (Pair, Pair)) {
    client_link.assert_idle().await;
    agent_link.assert_idle().await;
    client_link.shutdown().await;
    agent_link.shutdown().await;
}

#[tokio::test]
async fn bytes_cross_the_splice_exactly_both_ways() {
    const LEN: usize = 2 * 1024 * 1024;
    let (mut client_link, mut agent_link) = links().await;
    let mut c = chain(&mut client_link, &mut agent_link).await;
    let (up, down) = (payload(LEN, 5), payload(LEN, 6));
    let (sent_up, sent_down, at_far, at_client) = within("megabytes both ways", async {
        tokio::join!(
            send(&c.client.up, up.clone()),
            send(&c.far.up, down.clone()),
            recv_exact(&mut c.far.down, LEN),
            recv_exact(&mut c.client.down, LEN),
        )
    })
    .await;
    sent_up.unwrap();
    sent_down.unwrap();
    assert_same(&at_far, &up, "at the far end");
    assert_same(&at_client, &down, "at the client");
    // The far end closes normally: the client hears a normal close.
    c.far.finish(None);
    assert_eq!(recv_closed(&mut c.client.down).await, None);
    assert_eq!(
        within("the splice's end", c.middle).await.unwrap(),
        Spliced::Answerer(None)
    );
    drop(c.client);
    idle_and_shut((client_link, agent_link)).await;
}

#[tokio::test]
async fn the_far_end_s_error_reaches_the_client() {
    let (mut client_link, mut agent_link) = links().await;
    let mut c = chain(&mut client_link, &mut agent_link).await;
    c.far.finish(Some(CloseError::Local(
        "read from destination: reset".into(),
    )));
    let closed = recv_closed(&mut c.client.down).await;
    assert!(
        matches!(&closed, Some(e) if e.to_string().contains("read from destination: reset")),
        "{closed:?}"
    );
    within("the splice's end", c.middle).await.unwrap();
    drop(c.client);
    idle_and_shut((client_link, agent_link)).await;
}

#[tokio::test]
async fn the_client_s_close_reaches_the_far_end() {
    let (mut client_link, mut agent_link) = links().await;
    let mut c = chain(&mut client_link, &mut agent_link).await;
    c.client.up.close_request();
    // The far end is asked to close, as an agent's destination would be.
    assert_eq!(recv_closed(&mut c.far.down).await, None);
    assert_eq!(
        within("the splice's end", c.middle).await.unwrap(),
        Spliced::Dialer(None)
    );
    c.far.finish(None);
    assert_eq!(recv_closed(&mut c.client.down).await, None);
    drop(c.client);
    idle_and_shut((client_link, agent_link)).await;
}

#[tokio::test]
async fn a_stalled_reader_holds_back_only_its_own_connection() {
    const LEN: usize = 4 * 1024 * 1024;
    let (mut client_link, mut agent_link) = links().await;
    let stalled = chain(&mut client_link, &mut agent_link).await;
    let mut flowing = chain(&mut client_link, &mut agent_link).await;
    // The stalled connection's far end does not read yet: its window on both links fills.
    let Chain {
        client,
        far: mut stalled_far,
        middle: stalled_middle,
    } = stalled;
    let stuck = tokio::spawn(async move {
        let sent = client.up.send(payload(LEN, 7)).await;
        (client, sent)
    });
    let data = payload(LEN, 8);
    let (sent, got) = within("the other connection's megabytes", async {
        tokio::join!(
            send(&flowing.client.up, data.clone()),
            recv_exact(&mut flowing.far.down, LEN)
        )
    })
    .await;
    sent.unwrap();
    assert_same(&got, &data, "through the flowing connection");
    assert!(
        !stuck.is_finished(),
        "the stalled one cannot have sent it all"
    );
    // Reading the stalled one now lets it finish.
    let got = recv_exact(&mut stalled_far.down, LEN).await;
    assert_same(&got, &payload(LEN, 7), "through the stalled connection");
    let (client, sent) = within("the stalled sender", stuck).await.unwrap();
    sent.unwrap();
    let stalled = Chain {
        client,
        far: stalled_far,
        middle: stalled_middle,
    };
    for mut c in [stalled, flowing] {
        c.far.finish(None);
        assert_eq!(recv_closed(&mut c.client.down).await, None);
        within("the splice's end", c.middle).await.unwrap();
    }
    idle_and_shut((client_link, agent_link)).await;
}

#[tokio::test]
async fn a_close_ends_the_splice_while_the_other_way_waits_for_credit() {
    const LEN: usize = 4 * 1024 * 1024;
    let (mut client_link, mut agent_link) = links().await;
    let c = chain(&mut client_link, &mut agent_link).await;
    let Chain {
        client,
        mut far,
        middle,
    } = c;
    // The far end reads nothing: the upload fills its window and the middle waits for
    // credit that never comes.
    let uploading = tokio::spawn(async move {
        let _ = client.up.send(payload(LEN, 9)).await;
        client
    });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(
        !uploading.is_finished(),
        "the far end's window held the upload back"
    );
    // The upload gives up: its sender is dropped, which asks the middle to close; the
    // far end still answers something, which the closing connection no longer takes.
    uploading.abort();
    let _ = uploading.await;
    send(&far.up, b"late".to_vec()).await.unwrap();
    let spliced = within("the splice's end", middle).await.unwrap();
    assert!(
        matches!(spliced, Spliced::Dialer(_)),
        "the client's end ended it: {spliced:?}"
    );
    // The far end is asked to close, after whatever the middle had taken.
    let started = tokio::time::Instant::now();
    loop {
        match within("the far end's close", far.down.recv()).await {
            tether_tunnel::ConnEvent::Closed(_) => break,
            tether_tunnel::ConnEvent::Data(_) => far.down.consumed(),
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(20));
    }
    far.finish(None);
    idle_and_shut((client_link, agent_link)).await;
}
