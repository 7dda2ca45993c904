// Empty translation unit: it only carries the shared precompiled header
// (core/pch.h) that every other dflash target reuses.
