use super::*;

fn meta(id: &str) -> BlockMeta {
    BlockMeta {
        format_version: 1,
        id: id.to_string(),
        min_time_ms: 0,
        max_time_ms: 10,
        compaction_level: 0,
        replica: "r".into(),
        sources: vec![],
        series: 1,
        samples: 1,
        profiles: 1,
        size_bytes: 4,
    }
}

#[tokio::test]
async fn blocks_are_listed_only_once_meta_is_written_and_bad_metas_are_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = BucketConfig::Local {
        dir: dir.path().to_path_buf(),
    }
    .build()
    .expect("local store");
    let bucket = Bucket::new(Arc::clone(&store));
    let good = ulid::Ulid::new().to_string();
    bucket
        .put_block(&meta(&good), Bytes::from_static(b"data"))
        .await
        .expect("put");
    assert!(
        dir.path()
            .join("blocks/r")
            .join(&good)
            .join("meta.json")
            .is_file(),
        "written under its replica's prefix"
    );
    // Data without meta: incomplete, owned by the replica of its prefix.
    let partial = ulid::Ulid::new().to_string();
    store
        .put(
            &block_path(Some("other"), &partial, DATA_FILE),
            PutPayload::from_static(b"x"),
        )
        .await
        .expect("put");
    // Unparsable meta: corrupt, reported, not fatal.
    let bad = ulid::Ulid::new().to_string();
    store
        .put(
            &block_path(Some("r"), &bad, META_FILE),
            PutPayload::from_static(b"{nope"),
        )
        .await
        .expect("put");
    // A meta naming another replica than its prefix: corrupt too.
    let misplaced = ulid::Ulid::new().to_string();
    store
        .put(
            &block_path(Some("x"), &misplaced, META_FILE),
            PutPayload::from(serde_json::to_vec(&meta(&misplaced)).expect("json")),
        )
        .await
        .expect("put");
    let listing = bucket
        .list_blocks(&BTreeMap::new(), &BTreeSet::new())
        .await
        .expect("list");
    assert_eq!(listing.blocks.keys().collect::<Vec<_>>(), vec![&good]);
    assert_eq!(
        listing.incomplete,
        vec![IncompleteUpload {
            id: partial.clone(),
            owner: Some("other".into())
        }]
    );
    let mut corrupt: Vec<&str> = listing.corrupt.iter().map(|c| c.id.as_str()).collect();
    corrupt.sort_unstable();
    let mut expected = vec![bad.as_str(), misplaced.as_str()];
    expected.sort_unstable();
    assert_eq!(corrupt, expected);
    assert_eq!(
        bucket
            .get_block_data(&meta(&good))
            .await
            .expect("get")
            .as_ref(),
        b"data"
    );
    bucket.delete_block(&meta(&good)).await.expect("delete");
    bucket
        .delete_block(&meta(&good))
        .await
        .expect("delete twice");
    bucket
        .delete_incomplete(&listing.incomplete[0])
        .await
        .expect("delete incomplete");
    let listing = bucket
        .list_blocks(&BTreeMap::new(), &BTreeSet::new())
        .await
        .expect("list");
    assert!(listing.blocks.is_empty());
    assert!(listing.incomplete.is_empty());
}

#[tokio::test]
async fn blocks_at_the_old_layout_are_read_and_deleted_where_they_are() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = BucketConfig::Local {
        dir: dir.path().to_path_buf(),
    }
    .build()
    .expect("local store");
    let bucket = Bucket::new(Arc::clone(&store));
    let old = ulid::Ulid::new().to_string();
    store
        .put(
            &block_path(None, &old, DATA_FILE),
            PutPayload::from_static(b"old data"),
        )
        .await
        .expect("put data");
    store
        .put(
            &block_path(None, &old, META_FILE),
            PutPayload::from(serde_json::to_vec(&meta(&old)).expect("json")),
        )
        .await
        .expect("put meta");
    let abandoned = ulid::Ulid::new().to_string();
    store
        .put(
            &block_path(None, &abandoned, DATA_FILE),
            PutPayload::from_static(b"x"),
        )
        .await
        .expect("put");
    let listing = bucket
        .list_blocks(&BTreeMap::new(), &BTreeSet::new())
        .await
        .expect("list");
    assert_eq!(listing.blocks.keys().collect::<Vec<_>>(), vec![&old]);
    assert_eq!(
        listing.incomplete,
        vec![IncompleteUpload {
            id: abandoned,
            owner: None
        }]
    );
    assert_eq!(
        bucket
            .get_block_data(&meta(&old))
            .await
            .expect("get")
            .as_ref(),
        b"old data"
    );
    bucket.delete_block(&meta(&old)).await.expect("delete");
    assert!(!dir.path().join("blocks").join(&old).join("data").exists());
}
