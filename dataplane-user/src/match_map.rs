//! Adding and removing a registered job's member prefixes in the kernel's `MATCH_PREFIXES` trie,
//! through the maps the loader pinned (so the API needs no handle into the loader).
//!
//! Rule (see `dataplane_common::Config`): the kernel consults the trie only when
//! `CONFIG.n_prefixes > 0`. When the config file lists no `[match] prefixes`, every address already
//! matches; inserting a job's prefixes then would *narrow* what is monitored, so nothing is written.
//! Otherwise the job's prefixes are inserted and `n_prefixes` is recounted. Removal deletes only the
//! keys the job catalog says nobody else needs, and never lets `n_prefixes` fall to 0 (which would
//! widen matching to every address).
//!
//! Port ranges stay as configured: a job whose ports are outside `[match] tcp_ports/udp_ports`
//! is registered but its traffic is not counted (the caller warns).
use std::path::{Path, PathBuf};

use aya::maps::{lpm_trie::Key, Array, LpmTrie, Map, MapData, MapError};
use dataplane_common::{maps, PrefixKey, PrefixValue};

/// Problems writing the pinned maps.
#[derive(Debug, thiserror::Error)]
pub enum MatchMapError {
    #[error("cannot open the pinned map {path}: {source}; is the agent's pin directory intact?")]
    Open { path: PathBuf, source: MapError },
    #[error("cannot update {name}: {source}; the trie may be full (MATCH_PREFIXES holds {max}): use wider prefixes")]
    Update { name: &'static str, max: u32, source: MapError },
}

/// What [`add`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    /// `n_prefixes` is 0: every address is already monitored.
    AllAddressesMatched,
    /// Inserted; the trie now holds this many prefixes.
    Inserted { total: u32 },
}

fn open(pin_dir: &Path, name: &'static str) -> Result<Map, MatchMapError> {
    let path = pin_dir.join(name);
    let data = MapData::from_pin(&path).map_err(|source| MatchMapError::Open { path: path.clone(), source })?;
    Map::from_map_data(data).map_err(|source| MatchMapError::Open { path, source })
}

fn update_err(name: &'static str) -> impl Fn(MapError) -> MatchMapError {
    move |source| MatchMapError::Update { name, max: dataplane_common::MAX_PREFIXES, source }
}

type Trie = LpmTrie<MapData, [u8; 16], PrefixValue>;
type ConfigArray = Array<MapData, dataplane_common::Config>;

fn maps_of(pin_dir: &Path) -> Result<(Trie, ConfigArray), MatchMapError> {
    let trie = Trie::try_from(open(pin_dir, maps::MATCH_PREFIXES)?).map_err(update_err(maps::MATCH_PREFIXES))?;
    let config = ConfigArray::try_from(open(pin_dir, maps::CONFIG)?).map_err(update_err(maps::CONFIG))?;
    Ok((trie, config))
}

fn recount(trie: &Trie, config: &mut ConfigArray) -> Result<u32, MatchMapError> {
    let n = trie.keys().filter(Result::is_ok).count() as u32;
    let mut cfg = config.get(&0, 0).map_err(update_err(maps::CONFIG))?;
    // 0 would switch the prefix test off (match every address): keep it on.
    cfg.n_prefixes = n.max(1);
    config.set(0, cfg, 0).map_err(update_err(maps::CONFIG))?;
    Ok(n)
}

/// Inserts `keys` into the pinned `MATCH_PREFIXES` (see the module rule).
pub fn add(pin_dir: &Path, keys: &[PrefixKey]) -> Result<Added, MatchMapError> {
    let (mut trie, mut config) = maps_of(pin_dir)?;
    if config.get(&0, 0).map_err(update_err(maps::CONFIG))?.n_prefixes == 0 {
        return Ok(Added::AllAddressesMatched);
    }
    for k in keys {
        trie.insert(&Key::new(k.prefix_len, k.addr), 1, 0).map_err(update_err(maps::MATCH_PREFIXES))?;
    }
    Ok(Added::Inserted { total: recount(&trie, &mut config)? })
}

/// The prefixes in the pinned `MATCH_PREFIXES`.
pub fn keys(pin_dir: &Path) -> Result<Vec<PrefixKey>, MatchMapError> {
    let (trie, _) = maps_of(pin_dir)?;
    Ok(trie.keys().filter_map(Result::ok).map(|k| PrefixKey { prefix_len: k.prefix_len(), addr: k.data() }).collect())
}

/// Removes `keys` (already filtered to the unneeded ones) from the pinned `MATCH_PREFIXES`.
pub fn remove(pin_dir: &Path, keys: &[PrefixKey]) -> Result<(), MatchMapError> {
    let (mut trie, mut config) = maps_of(pin_dir)?;
    if config.get(&0, 0).map_err(update_err(maps::CONFIG))?.n_prefixes == 0 {
        return Ok(());
    }
    for k in keys {
        match trie.remove(&Key::new(k.prefix_len, k.addr)) {
            Ok(()) | Err(MapError::KeyNotFound) => {}
            Err(e) => return Err(update_err(maps::MATCH_PREFIXES)(e)),
        }
    }
    recount(&trie, &mut config).map(|_| ())
}
