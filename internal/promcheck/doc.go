// Package promcheck holds one test: the hub's hand-written /metrics
// exposition, parsed by Prometheus' own text parser
// (github.com/prometheus/common/expfmt). It is a module of its own, as
// benchmarks/ is, so that the parser never becomes a dependency of the main
// module; .ci/run tests it next to the benchmarks.
package promcheck
