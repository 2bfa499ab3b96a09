pub mod canned;
