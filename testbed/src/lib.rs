//! Network-namespace rigs for ringside's tests, demo and evaluations.
