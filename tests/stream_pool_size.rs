//! `OPENREG_STREAM_POOL_SIZE` (Note [StreamId assignment]): pools of 4
//! streams, ids `1 + level * 4 + slot`. Its own test binary, so the size is
//! set before the runtime reads its options.

use torch_openreg::runtime::device;
use torch_openreg::runtime::stream;

#[test]
fn a_pool_of_four_streams() {
    std::env::set_var("OPENREG_STREAM_POOL_SIZE", "4");
    assert_eq!(stream::pool_size(), 4);
    let streams = &device::context(0).unwrap().streams;

    let low: Vec<i64> = (0..5).map(|_| streams.from_pool(0).id()).collect();
    assert_eq!(low, [1, 2, 3, 4, 1], "the fifth stream wraps to the first");
    let high: Vec<i64> = (0..5).map(|_| streams.from_pool(-1).id()).collect();
    assert_eq!(high, [5, 6, 7, 8, 5]);
    for id in 1..=4 {
        assert_eq!(streams.get(id).unwrap().priority(), 0, "id {id}");
    }
    for id in 5..=8 {
        assert_eq!(streams.get(id).unwrap().priority(), -1, "id {id}");
    }

    // Every stream runs work; ids past the pools name none.
    for id in 0..=8 {
        let s = streams.get(id).unwrap();
        s.submit(stream::Task::Run(Box::new(|| Ok(())))).unwrap();
        s.synchronize().unwrap();
    }
    for id in [9, 65, -1] {
        let message = streams.get(id).err().unwrap().message;
        assert_eq!(
            message,
            format!(
                "stream id {id} is not an openreg stream of device 0 (valid ids are 0..=8: the default stream 0 and \
                 two pools of OPENREG_STREAM_POOL_SIZE=4 streams)"
            )
        );
        assert!(stream::check_stream_id(1, id).is_err());
    }
}
