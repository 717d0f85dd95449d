//! Pool hand-out order, in its own binary: it counts every `from_pool` call,
//! so no other test may take streams meanwhile.

use torch_openreg::runtime::device;
use torch_openreg::runtime::stream;

#[test]
fn pool_streams_round_robin_and_clamp_priority() {
    let streams = &device::context(1).unwrap().streams;
    let first = streams.from_pool(0);
    assert_eq!(
        stream::pool_size(),
        32,
        "OPENREG_STREAM_POOL_SIZE is unset: CUDA's 32"
    );
    let ids: Vec<i64> = (0..stream::pool_size())
        .map(|_| streams.from_pool(0).id())
        .collect();
    assert_eq!(
        ids.last().copied(),
        Some(first.id()),
        "the pool wraps around after 32"
    );
    let mut distinct = ids.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), stream::pool_size());
    assert!(ids.iter().all(|id| (1..=32).contains(id)));

    let high = streams.from_pool(-1);
    assert!((33..=64).contains(&high.id()));
    assert_eq!(high.priority(), -1);
    assert_eq!(
        streams.from_pool(-50).priority(),
        -1,
        "too high clamps to the highest"
    );
    assert_eq!(
        streams.from_pool(7).priority(),
        0,
        "too low clamps to the lowest"
    );
    assert!(streams.get(65).is_err());
    assert!(streams.get(-3).is_err());
}
