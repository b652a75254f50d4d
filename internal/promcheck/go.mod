module github.com/listenhub/listenhub/internal/promcheck

go 1.26.0

replace github.com/listenhub/listenhub => ../..

require (
	github.com/listenhub/listenhub v0.0.0-00010101000000-000000000000
	github.com/prometheus/client_model v0.6.3
	github.com/prometheus/common v0.74.0
)

require (
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/pgx/v5 v5.13.0 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/pandatix/go-abnf v0.5.5 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
