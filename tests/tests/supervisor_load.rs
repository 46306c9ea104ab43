//! Supervisor end to end under load: 50 concurrent conversations with the scripted agent, each
//! asking the real policy service; all complete, nothing crosses between them.

mod supervisor_support;

use std::path::PathBuf;
use std::time::Duration;

use supervisor_support::*;
use warden_proto::v1 as pb;

#[tokio::test(flavor = "multi_thread")]
async fn fifty_concurrent_conversations_complete_without_cross_talk() {
    let d = deploy(&[]).await;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..50 {
        let mut c = client(&d);
        set.spawn(async move {
            let ctx = format!("load-{i}");
            let file = format!("file-{i}.txt");
            let mut s = start(
                &mut c,
                turn(&ctx, &format!("turn-{i}"), &format!("write {file}")),
            )
            .await;
            let evs = collect(&mut s, Duration::from_secs(120)).await;
            let info = c
                .open_conversation(open(&ctx, pb::Profile::WorkspaceWrite))
                .await
                .unwrap()
                .into_inner();
            (i, file, evs, info)
        });
    }
    let mut roots = Vec::new();
    while let Some(r) = set.join_next().await {
        let (i, file, evs, info) = r.unwrap();
        let st = stop(&evs);
        assert_eq!(st.stop_reason, "end_turn", "conversation {i}: {evs:#?}");
        assert!(evs.iter().all(|e| e.turn_id == format!("turn-{i}")));
        let p = permissions(&evs);
        assert_eq!(p.len(), 1, "conversation {i}");
        assert!(
            p[0].tool_title.contains(&file),
            "conversation {i} saw {:?}",
            p[0].tool_title
        );
        let root = PathBuf::from(&info.root);
        let names: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("file-"))
            .collect();
        assert_eq!(
            names,
            vec![file.clone()],
            "conversation {i} root holds {names:?}"
        );
        roots.push(root);
    }
    roots.sort();
    roots.dedup();
    assert_eq!(roots.len(), 50, "every conversation has its own root");
    assert_eq!(health(&d).len(), 50);
}
