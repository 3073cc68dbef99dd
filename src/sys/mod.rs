//! Platform facts (layer 0): compute devices and the dtypes they take,
//! transparent huge pages, the process's memory and the machine's read
//! bandwidth, how many threads compute. Nothing here knows about models.

pub mod device;
pub mod hugepages;
pub mod memory;
pub mod named;
pub mod threads;
