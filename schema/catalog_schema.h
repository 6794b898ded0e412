/* catalog_schema.h -- the catalog's SQL schema as its migrations
 * (catalog_migrations.c), each the SQL that takes PRAGMA user_version from
 * i to i + 1; schema/catalog.sql holds their sum. The store that runs them
 * is catalog/catalog.c. Their text never changes once shipped. */
#ifndef REEL_SCHEMA_CATALOG_SCHEMA_H
#define REEL_SCHEMA_CATALOG_SCHEMA_H

/* The migrations in order: migration i takes user_version i to i + 1
 * (tests read the texts). */
extern const char cat_schema_v1_sql[];
extern const char cat_schema_v2_sql[];
extern const char cat_schema_v3_sql[];
extern const char cat_schema_v4_sql[];
extern const char cat_schema_v5_sql[];
extern const char cat_schema_v6_sql[];
extern const char cat_schema_v7_sql[];
extern const char cat_schema_v8_sql[];
extern const char *const cat_migrations[];
extern const int cat_n_migrations;

#endif
