/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

// Package lexicons holds the ATProto lexicon schemas of the knotless compute
// market (dev.knotless.market.*) and the com.atproto schemas they refer to,
// one JSON file per NSID at <nsid segments>/<name>.json.
package lexicons

import "embed"

// FS holds every lexicon JSON file of this directory, for
// lexicon.BaseCatalog.LoadEmbedFS. Use internal/lexicon rather than loading
// it again.
//
//go:embed com/atproto/repo/*.json dev/knotless/market/*.json dev/knotless/gateway/*.json
var FS embed.FS
